//! The plans, table by table: what each command writes and waits for from
//! what each key holds.

use super::*;
use crate::model::marks::DRAIN_FLAGS;

/// A key with Flags 0: set by hand (`state set`, `consul kv put`).
fn valid(state: AdminState, index: u64) -> Current {
    Current::Valid {
        state,
        index,
        flags: 0,
    }
}

/// A key written by `state drain`.
fn by_drain(state: AdminState, index: u64) -> Current {
    Current::Valid {
        state,
        index,
        flags: DRAIN_FLAGS,
    }
}

fn write(change: Change, flags: u64, keys: &[&str]) -> Step {
    Step::Write {
        change,
        flags,
        keys: keys.iter().map(|k| k.to_string()).collect(),
    }
}

fn key<'a>(plan: &'a Plan, key: &str) -> &'a KeyPlan {
    plan.keys.iter().find(|k| k.key == key).unwrap()
}

const W: Duration = Duration::from_secs(60);
const M: Duration = Duration::from_secs(5);
const DRAIN_WAIT: Step = Step::Wait {
    duration: W,
    purpose: WaitFor::Drain,
};
const MAINT_WAIT: Step = Step::Wait {
    duration: M,
    purpose: WaitFor::Maint,
};

#[test]
fn drain_goes_through_drain_then_maint_and_skips_maint() {
    let plan = plan_drain(
        vec![
            ("web/b".into(), Current::Absent),
            ("web/a".into(), valid(AdminState::Weight(50), 3)),
            ("web/c".into(), by_drain(AdminState::Maint, 4)),
            ("web/d".into(), by_drain(AdminState::Drain, 5)),
            ("web/e".into(), valid(AdminState::Ready, 6)),
        ],
        W,
        WaitFor::Drain,
    );
    assert_eq!(
        plan.steps,
        vec![
            write(
                Change::Set(AdminState::Drain),
                DRAIN_FLAGS,
                &["web/a", "web/b", "web/e"]
            ),
            DRAIN_WAIT,
            write(
                Change::Set(AdminState::Maint),
                DRAIN_FLAGS,
                &["web/a", "web/b", "web/d", "web/e"]
            ),
        ]
    );
    assert_eq!(plan.keys[0].key, "web/a");
    assert!(plan.keys[0].note.unwrap().contains("weight"));
    assert!(!plan.keys[2].changes(), "maint stays");
    assert_eq!(plan.keys[2].note, Some("already maint"));
    assert!(plan.keys.iter().all(|k| k.after == Some(AdminState::Maint)));
    assert!(plan.keys.iter().all(|k| !k.set_by_hand));
}

#[test]
fn drain_takes_over_keys_in_service_and_invalid_ones_it_marked() {
    let invalid = |flags| Current::Invalid {
        reason: "bad".into(),
        raw: "\"drian\"".into(),
        index: 9,
        flags,
    };
    let plan = plan_drain(
        vec![
            ("web/a".into(), valid(AdminState::Ready, 3)),
            ("web/b".into(), by_drain(AdminState::Ready, 4)),
            ("web/d".into(), invalid(DRAIN_FLAGS)),
            ("web/e".into(), valid(AdminState::Weight(1), 5)),
            ("web/f".into(), by_drain(AdminState::Weight(0), 6)),
        ],
        W,
        WaitFor::Drain,
    );
    let all = ["web/a", "web/b", "web/d", "web/e", "web/f"];
    assert_eq!(
        plan.steps,
        vec![
            write(Change::Set(AdminState::Drain), DRAIN_FLAGS, &all),
            DRAIN_WAIT,
            write(Change::Set(AdminState::Maint), DRAIN_FLAGS, &all),
        ]
    );
    assert!(plan.keys.iter().all(|k| !k.set_by_hand && k.changes()));
}

#[test]
fn drain_leaves_keys_set_by_hand_at_drain_or_maint_alone() {
    let plan = plan_drain(
        vec![
            ("web/a".into(), valid(AdminState::Drain, 3)),
            ("web/b".into(), valid(AdminState::Maint, 4)),
            (
                "web/c".into(),
                Current::Valid {
                    state: AdminState::Maint,
                    index: 5,
                    flags: 6,
                },
            ),
            ("web/d".into(), Current::Absent),
        ],
        W,
        WaitFor::Drain,
    );
    assert_eq!(
        plan.steps,
        vec![
            write(Change::Set(AdminState::Drain), DRAIN_FLAGS, &["web/d"]),
            DRAIN_WAIT,
            write(Change::Set(AdminState::Maint), DRAIN_FLAGS, &["web/d"]),
        ],
        "keys set by hand are in no step"
    );
    for (k, state) in [
        ("web/a", AdminState::Drain),
        ("web/b", AdminState::Maint),
        ("web/c", AdminState::Maint),
    ] {
        let k = key(&plan, k);
        assert!(k.set_by_hand, "{k:?}");
        assert_eq!(k.after, Some(state), "{k:?} keeps its value");
        assert!(!k.changes(), "{k:?}");
        assert_eq!(k.note, Some("set by hand: left alone"));
    }
    assert!(!key(&plan, "web/d").set_by_hand);
}

#[test]
fn drain_and_undrain_leave_keys_set_by_hand_at_0_percent_alone() {
    let targets = vec![
        ("web/a".into(), valid(AdminState::Weight(0), 3)),
        (
            "web/b".into(),
            Current::Valid {
                state: AdminState::Weight(0),
                index: 4,
                flags: 2,
            },
        ),
        ("web/c".into(), valid(AdminState::Weight(50), 5)),
    ];
    let plan = plan_drain(targets.clone(), W, WaitFor::Drain);
    assert_eq!(
        plan.steps,
        vec![
            write(Change::Set(AdminState::Drain), DRAIN_FLAGS, &["web/c"]),
            DRAIN_WAIT,
            write(Change::Set(AdminState::Maint), DRAIN_FLAGS, &["web/c"]),
        ],
        "0% set by hand is in no step; 50% is drained"
    );
    for k in ["web/a", "web/b"] {
        let k = key(&plan, k);
        assert!(k.set_by_hand, "{k:?}");
        assert_eq!(k.after, Some(AdminState::Weight(0)), "{k:?}");
        assert!(!k.changes(), "{k:?}");
        assert_eq!(k.note, Some("set by hand: left alone"));
    }
    assert!(key(&plan, "web/c").note.unwrap().contains("weight"));
    let plan = plan_undrain(targets, M, &RampArgs::default()).unwrap();
    assert!(plan.steps.is_empty());
    for k in ["web/a", "web/b"] {
        let k = key(&plan, k);
        assert!(k.set_by_hand, "{k:?}");
        assert!(k.note.unwrap().contains("state clear"), "{k:?}");
    }
    assert!(!key(&plan, "web/c").set_by_hand);
    // `canary disable` takes the canary key over whatever it holds.
    let plan = plan_drain(
        vec![("canary".into(), valid(AdminState::Weight(0), 3))],
        W,
        WaitFor::Drain,
    );
    assert_eq!(
        plan.steps[0],
        write(Change::Set(AdminState::Drain), 0, &["canary"])
    );
}

#[test]
fn drain_of_keys_set_by_hand_only_is_nothing() {
    let plan = plan_drain(
        vec![
            ("web/a".into(), valid(AdminState::Drain, 3)),
            ("web/b".into(), valid(AdminState::Maint, 4)),
        ],
        W,
        WaitFor::Drain,
    );
    assert!(plan.steps.is_empty());
}

#[test]
fn drain_of_maint_only_is_nothing() {
    let plan = plan_drain(
        vec![("web/a".into(), by_drain(AdminState::Maint, 9))],
        W,
        WaitFor::Drain,
    );
    assert!(plan.steps.is_empty());
    let plan = plan_drain(
        vec![("canary".into(), valid(AdminState::Maint, 9))],
        W,
        WaitFor::Drain,
    );
    assert!(plan.steps.is_empty());
    assert_eq!(plan.keys[0].note, Some("already maint"));
}

#[test]
fn interrupted_drain_waits_again() {
    let plan = plan_drain(
        vec![("web/a".into(), by_drain(AdminState::Drain, 9))],
        W,
        WaitFor::Drain,
    );
    assert_eq!(
        plan.steps,
        vec![
            DRAIN_WAIT,
            write(Change::Set(AdminState::Maint), DRAIN_FLAGS, &["web/a"]),
        ]
    );
    assert!(!plan.keys[0].set_by_hand);
}

#[test]
fn canary_takes_over_its_key_whatever_its_flags_and_writes_flags_0() {
    // `canary disable` left drain (Flags 0) when interrupted, or someone
    // put drain by hand: either way the canary key is taken to maint.
    let plan = plan_drain(
        vec![("canary".into(), valid(AdminState::Drain, 9))],
        W,
        WaitFor::Drain,
    );
    assert_eq!(
        plan.steps,
        vec![
            DRAIN_WAIT,
            write(Change::Set(AdminState::Maint), 0, &["canary"])
        ]
    );
    let plan = plan_drain(vec![("canary".into(), Current::Absent)], W, WaitFor::Drain);
    assert_eq!(
        plan.steps[0],
        write(Change::Set(AdminState::Drain), 0, &["canary"])
    );
    // Enable clears it whoever set it.
    for flags in [0, DRAIN_FLAGS] {
        let plan = plan_undrain(
            vec![(
                "canary".into(),
                Current::Valid {
                    state: AdminState::Drain,
                    index: 3,
                    flags,
                },
            )],
            M,
            &RampArgs::default(),
        )
        .unwrap();
        assert_eq!(
            plan.steps,
            vec![
                write(Change::Set(AdminState::Maint), 0, &["canary"]),
                MAINT_WAIT,
                write(Change::Clear, 0, &["canary"]),
            ]
        );
        assert!(!plan.keys[0].set_by_hand);
    }
}

#[test]
fn undrain_goes_through_maint_and_leaves_service_alone() {
    let plan = plan_undrain(
        vec![
            ("web/a".into(), by_drain(AdminState::Drain, 3)),
            ("web/b".into(), by_drain(AdminState::Maint, 4)),
            ("web/c".into(), valid(AdminState::Weight(50), 5)),
            ("web/d".into(), Current::Absent),
            ("web/e".into(), by_drain(AdminState::Ready, 6)),
        ],
        M,
        &RampArgs::default(),
    )
    .unwrap();
    assert_eq!(
        plan.steps,
        vec![
            write(Change::Set(AdminState::Maint), DRAIN_FLAGS, &["web/a"]),
            MAINT_WAIT,
            write(Change::Clear, 0, &["web/a", "web/b"]),
        ]
    );
    assert_eq!(plan.keys[2].after, Some(AdminState::Weight(50)));
    assert!(!plan.keys[2].changes());
    assert!(!plan.keys[3].changes());
    assert_eq!(plan.keys[4].note, Some("in service: left alone"));
    assert!(plan.keys.iter().all(|k| !k.set_by_hand));
}

#[test]
fn undrain_leaves_keys_set_by_hand_at_drain_or_maint_alone() {
    let plan = plan_undrain(
        vec![
            ("web/a".into(), valid(AdminState::Drain, 3)),
            ("web/b".into(), valid(AdminState::Maint, 4)),
            (
                "web/c".into(),
                Current::Valid {
                    state: AdminState::Drain,
                    index: 5,
                    flags: 2,
                },
            ),
            ("web/d".into(), by_drain(AdminState::Maint, 6)),
            ("web/e".into(), by_drain(AdminState::Drain, 7)),
        ],
        M,
        &RampArgs::default(),
    )
    .unwrap();
    assert_eq!(
        plan.steps,
        vec![
            write(Change::Set(AdminState::Maint), DRAIN_FLAGS, &["web/e"]),
            MAINT_WAIT,
            write(Change::Clear, 0, &["web/d", "web/e"]),
        ],
        "keys set by hand are in no step"
    );
    for (k, state) in [
        ("web/a", AdminState::Drain),
        ("web/b", AdminState::Maint),
        ("web/c", AdminState::Drain),
    ] {
        let k = key(&plan, k);
        assert!(k.set_by_hand, "{k:?}");
        assert_eq!(k.after, Some(state), "{k:?} keeps its value");
        assert!(!k.changes(), "{k:?}");
        assert!(k.note.unwrap().contains("state clear"), "{k:?}");
    }
    assert_eq!(key(&plan, "web/d").after, None);
    assert!(!key(&plan, "web/d").set_by_hand);
}

#[test]
fn undrain_of_keys_set_by_hand_only_is_nothing() {
    let plan = plan_undrain(
        vec![
            ("web/a".into(), valid(AdminState::Drain, 3)),
            ("web/b".into(), valid(AdminState::Maint, 4)),
        ],
        M,
        &RampArgs::default(),
    )
    .unwrap();
    assert!(plan.steps.is_empty());
    assert!(plan.keys.iter().all(|k| k.set_by_hand));
}

#[test]
fn a_row_key_with_a_typo_set_by_hand_is_left_alone_by_drain_and_undrain() {
    let typo = |flags| Current::Invalid {
        reason: "not a value".into(),
        raw: "\"mantenance\"".into(),
        index: 7,
        flags,
    };
    let rows = || {
        vec![
            ("web/a".to_string(), typo(0)),
            ("web/b".to_string(), typo(DRAIN_FLAGS)),
        ]
    };
    let plan = plan_drain(rows(), W, WaitFor::Drain);
    assert!(key(&plan, "web/a").set_by_hand);
    assert!(!key(&plan, "web/a").changes());
    assert!(!key(&plan, "web/b").set_by_hand && key(&plan, "web/b").changes());
    let drain = write(Change::Set(AdminState::Drain), DRAIN_FLAGS, &["web/b"]);
    assert_eq!(plan.steps[0], drain);
    // A group key is taken over whatever its Flags.
    let plan = plan_drain(vec![("zone-b".into(), typo(0))], W, WaitFor::Drain);
    assert!(!plan.keys[0].set_by_hand && plan.keys[0].changes());
    // Undrain refuses the marked row key and the group key, not the
    // one set by hand.
    let refused = plan_undrain(rows(), M, &RampArgs::default()).unwrap_err();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].0, "web/b");
    let group = vec![("zone-b".into(), typo(0))];
    assert!(plan_undrain(group, M, &RampArgs::default()).is_err());
    let plan = plan_undrain(rows()[..1].to_vec(), M, &RampArgs::default()).unwrap();
    assert!(plan.steps.is_empty() && plan.keys[0].set_by_hand);
}

#[test]
fn a_ramp_writes_each_weight_then_clears_and_goes_on_after_an_interruption() {
    let every = Duration::from_secs(30);
    let ramp = RampArgs {
        ramp: Some(crate::cli::RampSteps(vec![25, 50])),
        ramp_every: every,
    };
    let hold = Step::Wait {
        duration: every,
        purpose: WaitFor::Ramp,
    };
    let w = |n| Change::Set(AdminState::Weight(n));
    let plan = plan_undrain(
        vec![
            ("web/a".into(), by_drain(AdminState::Drain, 3)),
            ("web/b".into(), by_drain(AdminState::Maint, 4)),
            ("web/c".into(), by_drain(AdminState::Weight(25), 5)),
            ("web/d".into(), valid(AdminState::Weight(25), 6)),
        ],
        M,
        &ramp,
    )
    .unwrap();
    assert_eq!(
        plan.steps,
        vec![
            write(Change::Set(AdminState::Maint), DRAIN_FLAGS, &["web/a"]),
            MAINT_WAIT,
            write(w(25), DRAIN_FLAGS, &["web/a", "web/b"]),
            hold.clone(),
            write(w(50), DRAIN_FLAGS, &["web/a", "web/b", "web/c"]),
            hold.clone(),
            write(Change::Clear, 0, &["web/a", "web/b", "web/c"]),
        ]
    );
    assert_eq!(key(&plan, "web/d").note, Some("in service: left alone"));
    // A group key at a step goes on from it, whoever set it.
    let plan = plan_undrain(
        vec![("canary".into(), valid(AdminState::Weight(50), 3))],
        M,
        &ramp,
    )
    .unwrap();
    assert_eq!(plan.steps, vec![write(Change::Clear, 0, &["canary"])]);
    let plan = plan_undrain(
        vec![("canary".into(), valid(AdminState::Maint, 3))],
        M,
        &ramp,
    )
    .unwrap();
    assert_eq!(
        plan.steps,
        vec![
            write(w(25), 0, &["canary"]),
            hold.clone(),
            write(w(50), 0, &["canary"]),
            hold,
            write(Change::Clear, 0, &["canary"]),
        ]
    );
    // Without a ramp, an interrupted one is finished: the key removed.
    let plan = plan_undrain(
        vec![
            ("canary".into(), valid(AdminState::Weight(50), 3)),
            ("web/c".into(), by_drain(AdminState::Weight(25), 5)),
            ("web/d".into(), valid(AdminState::Weight(25), 6)),
        ],
        M,
        &RampArgs::default(),
    )
    .unwrap();
    assert_eq!(
        plan.steps,
        vec![write(Change::Clear, 0, &["canary", "web/c"])]
    );
    assert_eq!(
        key(&plan, "canary").note,
        Some("at an interrupted ramp's weight: finished, removed (ready 100%)")
    );
    assert_eq!(key(&plan, "web/d").note, Some("in service: left alone"));
}

#[test]
fn until_idle_turns_the_drain_wait_into_an_idle_wait() {
    let at_least = Duration::from_secs(5);
    let plan = plan_drain(
        vec![("web/a".into(), Current::Absent)],
        W,
        WaitFor::Idle { at_least },
    );
    assert_eq!(
        plan.steps[1],
        Step::Wait {
            duration: W,
            purpose: WaitFor::Idle { at_least }
        }
    );
    assert!(WaitFor::Idle { at_least }.drains());
}

#[test]
fn undrain_from_maint_needs_no_wait() {
    let plan = plan_undrain(
        vec![("canary".into(), valid(AdminState::Maint, 3))],
        M,
        &RampArgs::default(),
    )
    .unwrap();
    assert_eq!(plan.steps, vec![write(Change::Clear, 0, &["canary"])]);
    let plan = plan_undrain(
        vec![("web/a".into(), by_drain(AdminState::Maint, 3))],
        M,
        &RampArgs::default(),
    )
    .unwrap();
    assert_eq!(plan.steps, vec![write(Change::Clear, 0, &["web/a"])]);
}

#[test]
fn undrain_refuses_invalid_values_but_on_row_keys_set_by_hand() {
    for flags in [0, DRAIN_FLAGS] {
        let invalid = Current::from_pair(Some(&KvPair {
            key: "p/web/a".into(),
            value: b"drian".to_vec(),
            modify_index: 7,
            flags,
        }));
        for key in ["web/a", "canary"] {
            if key == "web/a" && flags == 0 {
                continue; // a_row_key_with_a_typo_set_by_hand_is_left_alone_by_drain_and_undrain
            }
            let err = plan_undrain(vec![(key.into(), invalid.clone())], M, &RampArgs::default())
                .unwrap_err();
            assert_eq!(err[0].0, key);
            assert!(err[0].1.contains("drian"));
        }
    }
}

#[test]
fn flags_are_read_from_the_pair_and_odd_flags_mark_a_drain() {
    let current = |value: &[u8], flags| {
        Current::from_pair(Some(&KvPair {
            key: "p/web/a".into(),
            value: value.to_vec(),
            modify_index: 3,
            flags,
        }))
    };
    assert_eq!(current(b"maint", 0), valid(AdminState::Maint, 3));
    assert_eq!(current(b"maint", 1), by_drain(AdminState::Maint, 3));
    assert!(current(b"maint", DRAIN_FLAGS).by_drain());
    assert!(!current(b"maint", DRAIN_FLAGS).set_by_hand());
    assert!(!current(b"0%", DRAIN_FLAGS).set_by_hand());
    for flags in [3, (u64::from(u32::MAX) << 1) | 1, u64::MAX] {
        assert!(current(b"maint", flags).by_drain(), "{flags}");
        assert!(!current(b"maint", flags).set_by_hand(), "{flags}");
        assert!(!current(b"drain", flags).set_by_hand(), "{flags}");
    }
    for flags in [0, 2, 4, u64::MAX - 1] {
        assert!(!current(b"maint", flags).by_drain(), "{flags}");
        assert!(current(b"maint", flags).set_by_hand(), "{flags}");
        assert!(current(b"drain", flags).set_by_hand(), "{flags}");
        assert!(!current(b"ready", flags).set_by_hand(), "{flags}");
        assert!(!current(b"50%", flags).set_by_hand(), "{flags}");
        assert!(!current(b"1%", flags).set_by_hand(), "{flags}");
        assert!(current(b"0%", flags).set_by_hand(), "{flags}");
    }
    assert_eq!(current(b"drian", 1).flags(), 1);
    assert!(
        !current(b"drian", 0).set_by_hand(),
        "invalid is not hand-set"
    );
    assert!(!Current::Absent.by_drain());
    assert_eq!(Current::Absent.flags(), 0);
}

#[test]
fn group_keys_are_taken_over_whoever_set_them_and_row_keys_only_with_the_mark() {
    // An earlier version's mark (a larger odd value) is a drain's mark.
    for flags in [DRAIN_FLAGS, 15] {
        let plan = plan_undrain(
            vec![(
                "web/a".into(),
                Current::Valid {
                    state: AdminState::Maint,
                    index: 3,
                    flags,
                },
            )],
            M,
            &RampArgs::default(),
        )
        .unwrap();
        assert_eq!(plan.steps, vec![write(Change::Clear, 0, &["web/a"])]);
    }
    let plan = plan_undrain(
        vec![("zone-b".into(), valid(AdminState::Maint, 3))],
        M,
        &RampArgs::default(),
    )
    .unwrap();
    assert_eq!(plan.steps, vec![write(Change::Clear, 0, &["zone-b"])]);
    let plan = plan_drain(
        vec![("zone-b".into(), valid(AdminState::Weight(0), 3))],
        W,
        WaitFor::Drain,
    );
    assert_eq!(
        plan.steps[0],
        write(Change::Set(AdminState::Drain), 0, &["zone-b"])
    );
    assert_eq!(flags_for("zone-b"), 0);
    assert_eq!(flags_for("web/a"), DRAIN_FLAGS);
}

#[test]
fn snapshot_after_applies_final_values() {
    let snap = Snapshot::default();
    let plan = plan_drain(vec![("canary".into(), Current::Absent)], W, WaitFor::Drain);
    let after = snapshot_after(&snap, &plan.keys);
    assert_eq!(
        after.lookup(["web/x", "canary"]),
        crate::model::snapshot::Answer::State {
            state: AdminState::Maint,
            decided_by: Some(1)
        }
    );
}

#[test]
fn slowstart_note_only_when_leaving_drain_for_service() {
    let drain = Current::Valid {
        state: AdminState::Drain,
        index: 1,
        flags: 0,
    };
    assert!(slowstart_note(&drain, Change::Clear).is_some());
    assert!(slowstart_note(&drain, Change::Set(AdminState::Ready)).is_some());
    assert!(slowstart_note(&drain, Change::Set(AdminState::Maint)).is_none());
    assert!(slowstart_note(&Current::Absent, Change::Set(AdminState::Ready)).is_none());
}

#[test]
fn set_takes_over_a_key_state_drain_wrote_and_says_so() {
    let maint = |flags| Current::Valid {
        state: AdminState::Maint,
        index: 1,
        flags,
    };
    assert!(takeover_note(&maint(DRAIN_FLAGS), Change::Set(AdminState::Maint)).is_some());
    assert!(takeover_note(&maint(DRAIN_FLAGS), Change::Set(AdminState::Drain)).is_some());
    assert!(takeover_note(&maint(DRAIN_FLAGS), Change::Set(AdminState::Weight(0))).is_some());
    assert!(takeover_note(&maint(DRAIN_FLAGS), Change::Set(AdminState::Weight(1))).is_none());
    assert!(takeover_note(&maint(DRAIN_FLAGS), Change::Set(AdminState::Ready)).is_none());
    assert!(takeover_note(&maint(DRAIN_FLAGS), Change::Clear).is_none());
    assert!(takeover_note(&maint(0), Change::Set(AdminState::Maint)).is_none());
    assert!(takeover_note(&Current::Absent, Change::Set(AdminState::Maint)).is_none());
}
