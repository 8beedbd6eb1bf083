//! One table test per rule of the core, driven through its public interface
//! as the daemon drives it: each step hands the core the response to the
//! request it asked for and checks what it asks next and what it serves.

use std::time::Duration;

use super::served::{Change, ServedState};
use super::stale::HoldReason;
use super::*;
use crate::model::answer::{PrefixAnswer, ReadMeta};
use crate::model::snapshot::Answer;
use crate::model::snapshot::KvPair;
use crate::model::value::AdminState::{self, Drain, Maint, Ready, Weight};

const FRESH: ReadMeta = ReadMeta {
    last_contact: Some(Duration::from_millis(2)),
    known_leader: Some(true),
    filtered_by_acls: None,
};

fn config(stale: bool) -> CoreConfig {
    CoreConfig {
        prefix: "p/".into(),
        stale,
        max_stale: Duration::from_secs(5),
        rules: Rules::default(),
    }
}

fn pair(key: &str, value: &str, modify_index: u64) -> KvPair {
    KvPair {
        key: format!("p/{key}"),
        value: value.as_bytes().to_vec(),
        modify_index,
        flags: 0,
    }
}

fn prefix(index: u64, pairs: &[(&str, &str, u64)]) -> Response {
    prefix_meta(index, pairs, FRESH)
}

fn prefix_meta(index: u64, pairs: &[(&str, &str, u64)], meta: ReadMeta) -> Response {
    Response::Prefix {
        answer: PrefixAnswer {
            index,
            pairs: pairs.iter().map(|(k, v, m)| pair(k, v, *m)).collect(),
            body_bytes: 0,
        },
        meta,
        token_load: 1,
    }
}

/// A core past its ACL probe, its next request the first prefix read.
fn started(acl: bool, stale: bool, restored: Option<ServedState>) -> Core {
    let mut core = Core::new(config(stale), restored);
    assert_eq!(core.start().request, Request::AclProbe);
    let out = core.on_response(Response::Acl { enabled: acl }, 0);
    assert_eq!(
        out.next.request,
        Request::Prefix {
            index: 0,
            stale: false
        },
        "the first read is a full default read"
    );
    core
}

fn step(core: &mut Core, response: Response) -> Output {
    core.on_response(response, 1_000)
}

fn served(core: &Core, key: &str) -> Option<AdminState> {
    core.served()
        .and_then(|s| s.keys.get(key))
        .and_then(|r| r.served)
}

/// What the core's snapshot answers for an agent-send line.
fn answers(core: &Core, line: &[&str]) -> Option<AdminState> {
    match core.served()?.snapshot().lookup(line.iter().copied()) {
        Answer::State { state, .. } => Some(state),
        _ => None,
    }
}

fn hold(core: &Core, key: &str) -> Option<HoldCause> {
    core.served()
        .and_then(|s| s.keys.get(key))
        .and_then(|r| r.hold)
        .map(|h| h.cause)
}

fn asks(out: &Output) -> &Request {
    &out.next.request
}

fn blocks_on(index: u64) -> Request {
    Request::Prefix {
        index,
        stale: false,
    }
}

/// A direct read's answer: `read`, with `X-Consul-Index` `index`.
fn key_read(core: &mut Core, read: KeyRead, index: u64) -> Output {
    step(
        core,
        Response::Key {
            read,
            index: Some(index),
        },
    )
}

/// The store id read after direct reads: absent (none was written), at
/// `index`.
fn no_store_id(core: &mut Core, index: u64) -> Output {
    key_read(core, KeyRead::Absent, index)
}

fn key(k: &str) -> Request {
    Request::Key {
        key: k.into(),
        stale: false,
    }
}

#[test]
fn index_rules_follow_consul_docs() {
    let mut c = started(false, false, None);
    let out = step(&mut c, prefix(10, &[("canary", "drain", 10)]));
    assert!(out.served_changed);
    assert!(out.notes.contains(&Note::FirstSync));
    assert_eq!(asks(&out), &blocks_on(10));
    assert_eq!(out.next.delay, Delay::MinInterval);
    // The wait ended with no change.
    let out = step(&mut c, prefix(10, &[("canary", "drain", 10)]));
    assert_eq!(out.notes, vec![Note::NotModified]);
    assert!(!out.served_changed);
    // Backwards: a reset, applied with holds, then a full read.
    let out = step(&mut c, prefix(4, &[]));
    assert!(out.notes.contains(&Note::IndexReset {
        previous: 10,
        index: 4,
        reaped: false
    }));
    assert_eq!(served(&c, "canary"), Some(Drain));
    assert_eq!(hold(&c, "canary"), Some(HoldCause::RolledBack));
    assert_eq!(asks(&out), &blocks_on(0));
    let out = step(&mut c, prefix(4, &[]));
    assert_eq!(asks(&out), &blocks_on(4));
    // An index of 0 counts as 1.
    let mut c = started(false, false, None);
    let out = step(&mut c, prefix(0, &[]));
    assert_eq!(asks(&out), &blocks_on(1));
}

#[test]
fn a_failure_backs_off_reads_in_full_and_asks_about_acls_before_applying() {
    let mut c = started(false, false, None);
    step(&mut c, prefix(10, &[("canary", "drain", 10)]));
    // Each retry is one request: the full read.
    for n in 1..=3 {
        let out = step(&mut c, Response::Failed { forbidden: false });
        assert_eq!(asks(&out), &blocks_on(0));
        assert_eq!(out.next.delay, Delay::Backoff(n));
        assert!(!out.reload_token);
    }
    let out = step(&mut c, Response::Failed { forbidden: true });
    assert!(out.reload_token, "a 403 reads the token file again");
    // The read that succeeds waits for the ACL probe, which may itself fail.
    let out = step(&mut c, prefix(10, &[("x", "ready", 10)]));
    assert_eq!(asks(&out), &Request::AclProbe);
    assert_eq!(out.next.delay, Delay::None);
    assert!(!out.served_changed);
    let out = step(&mut c, Response::Failed { forbidden: false });
    assert_eq!(asks(&out), &blocks_on(0));
    assert_eq!(out.next.delay, Delay::Backoff(5));
    let out = step(&mut c, prefix(10, &[("x", "ready", 10)]));
    assert_eq!(asks(&out), &Request::AclProbe);
    // Back at the same index with other data (a restarted Consul): lost
    // data, the drain is held.
    step(&mut c, Response::Acl { enabled: false });
    assert_eq!(served(&c, "canary"), Some(Drain));
    assert_eq!(hold(&c, "canary"), Some(HoldCause::RolledBack));
    assert_eq!(c.failures(), 0);
}

#[test]
fn with_acls_disabled_a_change_costs_one_request() {
    let mut c = started(false, false, None);
    step(
        &mut c,
        prefix(5, &[("canary", "drain", 5), ("web/a", "maint", 4)]),
    );
    // Add, change, delete: each answer is followed by the next blocking read.
    for (index, pairs) in [
        (
            6,
            vec![
                ("canary", "drain", 5),
                ("web/a", "maint", 4),
                ("web/b", "drain", 6),
            ],
        ),
        (
            7,
            vec![
                ("canary", "maint", 7),
                ("web/a", "maint", 4),
                ("web/b", "drain", 6),
            ],
        ),
        (8, vec![("canary", "maint", 7), ("web/b", "drain", 6)]),
    ] {
        let out = step(&mut c, prefix(index, &pairs));
        assert_eq!(asks(&out), &blocks_on(index));
    }
    assert_eq!(served(&c, "web/a"), None, "the delete applied");
    assert_eq!(served(&c, "canary"), Some(Maint));
}

#[test]
fn with_acls_on_a_lacking_key_is_read_directly() {
    // (direct read, what the key serves after, its hold)
    let table = [
        (KeyRead::Absent, None, None),
        (KeyRead::Forbidden, Some(Drain), Some(HoldCause::Hidden)),
        (
            KeyRead::Present(pair("canary", "maint", 9)),
            Some(Maint),
            None,
        ),
    ];
    for (read, want, want_hold) in table {
        let mut c = started(true, false, None);
        let out = step(&mut c, prefix(5, &[("canary", "drain", 5)]));
        assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
        step(&mut c, Response::ReadCheck { allowed: true });
        let out = step(&mut c, prefix(9, &[("web/a", "ready", 9)]));
        assert_eq!(asks(&out), &key("canary"));
        assert_eq!(served(&c, "canary"), Some(Drain), "nothing applied yet");
        let mut out = key_read(&mut c, read.clone(), 9);
        if read == KeyRead::Forbidden {
            // A 403: the token's read access is checked before applying.
            assert!(out.reload_token);
            assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
            out = step(&mut c, Response::ReadCheck { allowed: true });
        } else {
            assert_eq!(asks(&out), &key("~store-id"), "{read:?}");
            assert_eq!(served(&c, "canary"), Some(Drain), "nothing applied yet");
            out = no_store_id(&mut c, 9);
        }
        assert_eq!(asks(&out), &blocks_on(9));
        assert_eq!(served(&c, "canary"), want, "{read:?}");
        assert_eq!(hold(&c, "canary"), want_hold, "{read:?}");
        assert_eq!(served(&c, "web/a"), Some(Ready));
    }
}

#[test]
fn a_hidden_key_is_read_again_and_released_once_readable() {
    let mut c = started(true, false, None);
    step(&mut c, prefix(5, &[("canary", "drain", 5)]));
    step(&mut c, Response::ReadCheck { allowed: true });
    step(&mut c, prefix(6, &[("x", "ready", 6)]));
    step(
        &mut c,
        Response::Key {
            read: KeyRead::Forbidden,
            index: None,
        },
    );
    step(&mut c, Response::ReadCheck { allowed: true });
    assert_eq!(hold(&c, "canary"), Some(HoldCause::Hidden));
    let out = step(&mut c, prefix(7, &[("x", "ready", 7)]));
    assert_eq!(
        asks(&out),
        &Request::ReadCheck { stale: false },
        "a new token"
    );
    let out = step(&mut c, Response::ReadCheck { allowed: true });
    assert_eq!(asks(&out), &key("canary"));
    key_read(&mut c, KeyRead::Absent, 7);
    no_store_id(&mut c, 7);
    assert_eq!(served(&c, "canary"), None);
    assert_eq!(hold(&c, "canary"), None);
}

#[test]
fn a_forbidden_read_says_whether_the_key_was_already_held_hidden() {
    // (answer index, the direct read of canary, the note's already_hidden)
    let table = [
        (6, KeyRead::Forbidden, false),
        (7, KeyRead::Forbidden, true),
        (8, KeyRead::Forbidden, true),
        (9, KeyRead::Present(pair("canary", "maint", 9)), true),
        (10, KeyRead::Forbidden, false),
    ];
    let mut c = started(true, false, None);
    step(&mut c, prefix(5, &[("canary", "drain", 5)]));
    step(&mut c, Response::ReadCheck { allowed: true });
    for (index, read, already_hidden) in table {
        // Every answer lacks canary: it is read directly each time.
        let mut out = step(&mut c, prefix(index, &[("x", "ready", index)]));
        if asks(&out) == &(Request::ReadCheck { stale: false }) {
            out = step(&mut c, Response::ReadCheck { allowed: true });
        }
        assert_eq!(asks(&out), &key("canary"), "at {index}");
        let result = match read {
            KeyRead::Forbidden => "forbidden",
            _ => "present",
        };
        let mut out = key_read(&mut c, read, index);
        assert!(
            out.notes.contains(&Note::Probed {
                key: "canary".into(),
                result,
                already_hidden,
            }),
            "at {index}: {:?}",
            out.notes
        );
        if asks(&out) == &(Request::ReadCheck { stale: false }) {
            out = step(&mut c, Response::ReadCheck { allowed: true });
        }
        if asks(&out) == &key("~store-id") {
            out = no_store_id(&mut c, index);
        }
        assert_eq!(asks(&out), &blocks_on(index), "at {index}");
        let want = (result == "forbidden").then_some(HoldCause::Hidden);
        assert_eq!(hold(&c, "canary"), want, "at {index}");
    }
}

#[test]
fn filtered_by_acls_header_turns_on_direct_reads_even_if_the_probe_said_off() {
    let mut c = started(false, false, None);
    step(&mut c, prefix(5, &[("canary", "drain", 5)]));
    let meta = ReadMeta {
        filtered_by_acls: Some(true),
        ..FRESH
    };
    let out = step(&mut c, prefix_meta(6, &[("x", "ready", 6)], meta));
    assert!(out.notes.contains(&Note::FilteredByAcls));
    assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
    let out = step(&mut c, Response::ReadCheck { allowed: true });
    assert_eq!(asks(&out), &key("canary"));
}

#[test]
fn read_checks_come_with_every_404_and_every_token_load() {
    let mut c = started(true, false, None);
    let out = step(&mut c, prefix(3, &[]));
    assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
    let out = step(&mut c, Response::ReadCheck { allowed: false });
    assert!(out.reload_token);
    assert!(out.notes.contains(&Note::ReadCheckDenied));
    assert!(
        c.served().is_none(),
        "a token that may not read is never synced"
    );
    step(&mut c, Response::Acl { enabled: true });
    step(&mut c, prefix(3, &[("canary", "drain", 3)]));
    let out = step(&mut c, Response::ReadCheck { allowed: true });
    assert_eq!(asks(&out), &blocks_on(3));
    // Same token: no check on the next change.
    let out = step(
        &mut c,
        prefix(4, &[("canary", "drain", 3), ("x", "ready", 4)]),
    );
    assert_eq!(asks(&out), &blocks_on(4));
    // A new token load: checked again.
    let Response::Prefix { answer, meta, .. } =
        prefix(5, &[("canary", "drain", 3), ("x", "ready", 5)])
    else {
        unreachable!()
    };
    let out = step(
        &mut c,
        Response::Prefix {
            answer,
            meta,
            token_load: 2,
        },
    );
    assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
}

#[test]
fn invalid_values_are_held_at_the_last_valid_state_or_skipped() {
    let mut c = started(false, false, None);
    step(
        &mut c,
        prefix(
            5,
            &[
                ("web/s1", "maint", 5),
                ("web/s2", "mantenance", 5),
                ("canary", "drain", 4),
            ],
        ),
    );
    assert_eq!(served(&c, "web/s2"), None, "no valid state known: skipped");
    let snap = c.served().unwrap().snapshot();
    assert_eq!(
        snap.lookup(["web/s2", "canary"]),
        Answer::State {
            state: Drain,
            decided_by: Some(1)
        },
        "the group decides past the skipped row key"
    );
    let out = step(
        &mut c,
        prefix(
            6,
            &[
                ("web/s1", "drian", 6),
                ("web/s2", "mantenance", 5),
                ("canary", "drain", 4),
            ],
        ),
    );
    assert_eq!(served(&c, "web/s1"), Some(Maint));
    assert_eq!(hold(&c, "web/s1"), Some(HoldCause::InvalidValue));
    assert!(matches!(&out.notes[0], Note::Applied { changes, .. }
        if changes.iter().any(|ch| matches!(ch, Change::Invalid { key, held: Some(Maint), .. } if &**key == "web/s1"))));
    step(
        &mut c,
        prefix(
            7,
            &[
                ("web/s1", "50%", 7),
                ("web/s2", "mantenance", 5),
                ("canary", "drain", 4),
            ],
        ),
    );
    assert_eq!(served(&c, "web/s1"), Some(Weight(50)));
    assert_eq!(hold(&c, "web/s1"), None);
}

#[test]
fn a_store_that_lost_its_data_is_seen_whatever_its_index() {
    let mut c = started(false, false, None);
    step(
        &mut c,
        prefix(
            12,
            &[
                ("~store-id", "a1", 2),
                ("canary", "drain", 10),
                ("web/s5", "maint", 12),
                ("web/s6", "ready", 11),
            ],
        ),
    );
    // A rebuilt store at a higher index, with one key written since.
    let out = step(&mut c, prefix(43, &[("web/s6", "ready", 40)]));
    assert!(out.notes.contains(&Note::StoreChanged {
        previous: "a1".into(),
        now: None
    }));
    assert_eq!(served(&c, "canary"), Some(Drain));
    assert_eq!(served(&c, "web/s5"), Some(Maint));
    assert_eq!(served(&c, "web/s6"), Some(Ready));
    assert_eq!(c.served().unwrap().held_count(HoldCause::RolledBack), 2);
    // Still held on the next answers; a write to one releases it.
    step(
        &mut c,
        prefix(44, &[("web/s6", "ready", 40), ("x", "ready", 44)]),
    );
    assert_eq!(served(&c, "canary"), Some(Drain));
    step(
        &mut c,
        prefix(
            45,
            &[
                ("web/s6", "ready", 40),
                ("x", "ready", 44),
                ("web/s5", "ready", 45),
            ],
        ),
    );
    assert_eq!(served(&c, "web/s5"), Some(Ready));
    assert_eq!(hold(&c, "web/s5"), None);
    // The release key releases the rest.
    let out = step(
        &mut c,
        prefix(
            46,
            &[
                ("web/s6", "ready", 40),
                ("web/s5", "ready", 45),
                ("~release-rollback", "1", 46),
            ],
        ),
    );
    assert_eq!(served(&c, "canary"), None);
    assert!(matches!(&out.notes[0], Note::Applied { changes, .. }
        if changes.contains(&Change::ReleasedAll { keys: 1 })));
}

/// A store that lost its data (a rebuilt one: another store id) showing,
/// for keys served before, values higher and lower in the order of traffic.
fn lose_data_under_weights(rules: Rules) -> Core {
    let mut c = Core::new(
        CoreConfig {
            rules,
            ..config(false)
        },
        None,
    );
    c.start();
    step(&mut c, Response::Acl { enabled: false });
    step(
        &mut c,
        prefix(
            20,
            &[
                ("~store-id", "a1", 2),
                ("web/s1", "0%", 10),
                ("web/s2", "40%", 11),
                ("web/s3", "maint", 12),
                ("web/s4", "25%", 13),
                ("web/s5", "drain", 14),
                ("web/s6", "50%", 15),
                ("web/s7", "150%", 16),
            ],
        ),
    );
    step(
        &mut c,
        prefix(
            9,
            &[
                ("~store-id", "b2", 2),
                ("web/s1", "ready", 3),
                ("web/s3", "drain", 4),
                ("web/s4", "10%", 5),
                ("web/s5", "0%", 6),
                ("web/s6", "50%", 7),
            ],
        ),
    );
    c
}

#[test]
fn a_store_that_lost_its_data_keeps_the_lower_side_of_the_order_of_traffic() {
    let c = lose_data_under_weights(Rules::default());
    let rolled = Some(HoldCause::RolledBack);
    // (key, served, hold): more traffic is held, less applies.
    let table = [
        ("web/s1", Some(Weight(0)), rolled),  // 0% -> ready
        ("web/s2", Some(Weight(40)), rolled), // 40% -> gone: ready
        ("web/s3", Some(Maint), rolled),      // maint -> drain
        ("web/s4", Some(Weight(10)), None),   // 25% -> 10%
        ("web/s5", Some(Drain), rolled),      // drain -> 0%
        ("web/s6", Some(Weight(50)), None),   // the same
        ("web/s7", None, None),               // 150% -> gone: ready, less
    ];
    for (key, want, want_hold) in table {
        assert_eq!((served(&c, key), hold(&c, key)), (want, want_hold), "{key}");
    }
    // Before weights were in the order, only drain and maint were held.
    let c = lose_data_under_weights(Rules::default().without(Rule::TrafficOrder));
    assert_eq!(served(&c, "web/s1"), Some(Ready));
    assert_eq!(served(&c, "web/s2"), None);
    assert_eq!(served(&c, "web/s3"), Some(Drain));
}

#[test]
fn a_held_key_takes_a_value_that_keeps_servers_out_whatever_its_modify_index() {
    let mut c = started(false, false, None);
    step(
        &mut c,
        prefix(12, &[("~store-id", "a1", 2), ("canary", "drain", 10)]),
    );
    // A rebuilt store: canary held at drain, and web/s1's `ready`, which
    // appeared from it, held absent.
    step(
        &mut c,
        prefix(53, &[("~store-id", "b2", 50), ("web/s1", "ready", 53)]),
    );
    assert_eq!(hold(&c, "canary"), Some(HoldCause::RolledBack));
    assert_eq!(hold(&c, "web/s1"), Some(HoldCause::RolledBack));
    assert_eq!(served(&c, "web/s1"), None);
    // An old snapshot of that store restored between two reads (unseen:
    // same store id, the index ahead again), then `maint` written to web/s1
    // at the ModifyIndex its `ready` had: the hold cannot tell it from the
    // value it holds by the ModifyIndex, but maint undoes no drain.
    step(
        &mut c,
        prefix(
            54,
            &[
                ("~store-id", "b2", 50),
                ("web/s1", "maint", 53),
                ("zone-a", "50%", 54),
            ],
        ),
    );
    assert_eq!(served(&c, "web/s1"), Some(Maint));
    assert_eq!(hold(&c, "web/s1"), None);
    // canary, which the answer does not show, stays held.
    assert_eq!(served(&c, "canary"), Some(Drain));
}

#[test]
fn a_held_key_that_shows_up_written_before_the_last_answer_stays_held() {
    // ACLs on; every read check the core asks for passes.
    let mut c = started(true, false, None);
    let apply = |c: &mut Core, response: Response| {
        let out = step(c, response);
        if asks(&out) == &(Request::ReadCheck { stale: false }) {
            step(c, Response::ReadCheck { allowed: true });
        }
    };
    apply(
        &mut c,
        prefix(15, &[("~store-id", "a1", 11), ("zone-a", "maint", 15)]),
    );
    assert_eq!(served(&c, "zone-a"), Some(Maint));
    // An old snapshot restored (index 13), read while the token could not
    // read the prefix (its read check passed later, the policy fixed by
    // then): zone-a, `ready` at 12 there, is lacking; maint held.
    apply(&mut c, prefix(13, &[("~store-id", "a1", 11)]));
    assert_eq!(hold(&c, "zone-a"), Some(HoldCause::RolledBack));
    assert_eq!(served(&c, "zone-a"), Some(Maint));
    // zone-a shows up with the ModifyIndex 12, below the index of the answer
    // that lacked it: it was there all along (filtered), not written since.
    // The hold stays.
    apply(
        &mut c,
        prefix(
            15,
            &[
                ("~store-id", "a1", 11),
                ("zone-a", "ready", 12),
                ("web/s3", "drian", 15),
            ],
        ),
    );
    assert_eq!(answers(&c, &["zone-a"]), Some(Maint));
    assert_eq!(hold(&c, "zone-a"), Some(HoldCause::RolledBack));
    // A write since releases it.
    apply(
        &mut c,
        prefix(
            16,
            &[
                ("~store-id", "a1", 11),
                ("zone-a", "ready", 16),
                ("web/s3", "drian", 15),
            ],
        ),
    );
    assert_eq!(served(&c, "zone-a"), Some(Ready));
    assert_eq!(hold(&c, "zone-a"), None);
}

#[test]
fn a_real_delete_with_the_store_id_in_place_applies() {
    let mut c = started(false, false, None);
    step(
        &mut c,
        prefix(12, &[("~store-id", "a1", 2), ("canary", "drain", 10)]),
    );
    step(&mut c, prefix(13, &[("~store-id", "a1", 2)]));
    assert_eq!(served(&c, "canary"), None);
}

#[test]
fn without_the_store_id_rule_a_rebuilt_store_undrains() {
    let mut cfg = config(false);
    cfg.rules = cfg.rules.without(Rule::StoreId);
    let mut c = Core::new(cfg, None);
    c.start();
    step(&mut c, Response::Acl { enabled: false });
    step(
        &mut c,
        prefix(12, &[("~store-id", "a1", 2), ("canary", "drain", 10)]),
    );
    step(&mut c, prefix(43, &[("x", "ready", 43)]));
    assert_eq!(served(&c, "canary"), None);
}

#[test]
fn a_restored_state_is_served_at_once_and_keeps_its_holds() {
    let mut c = started(false, false, None);
    step(
        &mut c,
        prefix(
            12,
            &[
                ("~store-id", "a1", 2),
                ("canary", "drain", 10),
                ("web/s1", "maint", 11),
            ],
        ),
    );
    step(
        &mut c,
        prefix(
            13,
            &[
                ("~store-id", "a1", 2),
                ("canary", "drain", 10),
                ("web/s1", "mantenance", 13),
            ],
        ),
    );
    let file = c.served().unwrap().to_file("p/");
    let restored = ServedState::from_file("p/", &file).unwrap();
    assert_eq!(&restored, c.served().unwrap());

    let mut r = started(false, false, Some(restored));
    assert_eq!(
        served(&r, "web/s1"),
        Some(Maint),
        "served before any answer"
    );
    assert!(!r.synced());
    let out = step(
        &mut r,
        prefix(
            13,
            &[
                ("~store-id", "a1", 2),
                ("canary", "drain", 10),
                ("web/s1", "mantenance", 13),
            ],
        ),
    );
    assert!(out.notes.contains(&Note::FirstSync));
    assert_eq!(served(&r, "web/s1"), Some(Maint));
    assert_eq!(hold(&r, "web/s1"), Some(HoldCause::InvalidValue));
    assert!(!out.served_changed, "the same state: nothing to write");

    // Restarted against a store that lost its data: still held.
    let restored = ServedState::from_file("p/", &file).unwrap();
    let mut r = started(false, false, Some(restored));
    step(&mut r, prefix(3, &[]));
    assert_eq!(served(&r, "canary"), Some(Drain));
    assert_eq!(served(&r, "web/s1"), Some(Maint));
}

#[test]
fn a_restart_after_a_delete_applies_it() {
    let mut c = started(false, false, None);
    step(
        &mut c,
        prefix(12, &[("~store-id", "a1", 2), ("canary", "drain", 10)]),
    );
    let restored = c.served().cloned();
    let mut r = started(false, false, restored);
    step(&mut r, prefix(14, &[("~store-id", "a1", 2)]));
    assert_eq!(served(&r, "canary"), None);
}

#[test]
fn stale_answers_that_could_go_backwards_are_confirmed_by_the_leader() {
    let mut c = started(false, true, None);
    let out = step(&mut c, prefix(10, &[("canary", "drain", 10)]));
    assert_eq!(
        asks(&out),
        &Request::Prefix {
            index: 10,
            stale: true
        }
    );
    // (answer index, meta, held for)
    let behind = ReadMeta {
        last_contact: Some(Duration::from_secs(9)),
        ..FRESH
    };
    let leaderless = ReadMeta {
        known_leader: Some(false),
        ..FRESH
    };
    for (index, meta, reason) in [
        (1, FRESH, HoldReason::LowerIndex),
        (11, behind, HoldReason::TooOld),
        (11, leaderless, HoldReason::NoLeader),
    ] {
        let out = step(&mut c, prefix_meta(index, &[], meta));
        assert!(matches!(out.notes[0], Note::StaleHeld { reason: r, .. } if r == reason));
        assert_eq!(asks(&out), &blocks_on(0), "a default full read confirms");
        assert_eq!(served(&c, "canary"), Some(Drain));
        let out = step(&mut c, prefix(10, &[("canary", "drain", 10)]));
        assert_eq!(
            asks(&out),
            &Request::Prefix {
                index: 10,
                stale: true
            }
        );
    }
    // After a failure, the stale read that succeeds waits for the ACL probe
    // and is still judged as stale.
    let out = step(&mut c, Response::Failed { forbidden: false });
    assert_eq!(
        asks(&out),
        &Request::Prefix {
            index: 0,
            stale: true
        }
    );
    let out = step(&mut c, prefix_meta(1, &[], FRESH));
    assert_eq!(asks(&out), &Request::AclProbe);
    let out = step(&mut c, Response::Acl { enabled: false });
    assert!(matches!(
        out.notes[1],
        Note::StaleHeld {
            reason: HoldReason::LowerIndex,
            ..
        }
    ));
    assert_eq!(asks(&out), &blocks_on(0));
    assert_eq!(hold(&c, "canary"), None);
}

#[test]
fn a_stale_direct_read_behind_the_answer_is_asked_of_the_leader() {
    let mut c = started(true, true, None);
    step(&mut c, prefix(10, &[("canary", "drain", 10)]));
    step(&mut c, Response::ReadCheck { allowed: true });
    let out = step(&mut c, prefix(12, &[("x", "ready", 12)]));
    assert_eq!(
        asks(&out),
        &Request::Key {
            key: "canary".into(),
            stale: true
        }
    );
    let out = key_read(&mut c, KeyRead::Absent, 9);
    assert_eq!(asks(&out), &key("canary"));
    let out = key_read(&mut c, KeyRead::Absent, 12);
    assert_eq!(
        asks(&out),
        &Request::Key {
            key: "~store-id".into(),
            stale: true
        }
    );
    no_store_id(&mut c, 12);
    assert_eq!(served(&c, "canary"), None);
}

#[test]
fn a_direct_read_from_a_store_that_lost_data_meanwhile_is_not_taken() {
    // (store id read after the direct read, applied). Consul answers a read
    // of a present key with its ModifyIndex as X-Consul-Index (KVS.Get),
    // below the answer's index once anything was written after it.
    let id = |v: &str, modify_index| Response::Key {
        read: KeyRead::Present(pair("~store-id", v, modify_index)),
        index: Some(modify_index),
    };
    let absent = Response::Key {
        read: KeyRead::Absent,
        index: Some(40),
    };
    for (check, applied) in [
        (id("a1", 2), true),
        (id("b2", 40), false),
        (id("a1", 7), false),
        (absent, false),
    ] {
        let mut c = started(true, false, None);
        step(
            &mut c,
            prefix(5, &[("~store-id", "a1", 2), ("canary", "drain", 5)]),
        );
        step(&mut c, Response::ReadCheck { allowed: true });
        step(
            &mut c,
            prefix(9, &[("~store-id", "a1", 2), ("x", "ready", 9)]),
        );
        let gone = Response::Key {
            read: KeyRead::Absent,
            index: Some(9),
        };
        let out = step(&mut c, gone);
        assert_eq!(asks(&out), &key("~store-id"));
        let out = step(&mut c, check.clone());
        if applied {
            assert_eq!(served(&c, "canary"), None, "{check:?}");
            assert_eq!(asks(&out), &blocks_on(9));
        } else {
            assert!(out.notes.contains(&Note::StoreMoved), "{check:?}");
            assert_eq!(served(&c, "canary"), Some(Drain), "{check:?}");
            assert_eq!(asks(&out), &blocks_on(0));
        }
    }
}

#[test]
fn an_answer_past_every_key_it_shows_is_read_once_more() {
    let mut c = started(true, false, None);
    step(&mut c, prefix(5, &[("canary", "drain", 5)]));
    step(&mut c, Response::ReadCheck { allowed: true });
    let out = step(&mut c, prefix(8, &[("canary", "drain", 5)]));
    assert_eq!(out.notes, vec![Note::Refused(Refused::HidesWrites)]);
    assert_eq!(asks(&out), &blocks_on(0));
    // The fresh read shows the hidden key, and the token's read access is
    // checked (a narrowed policy is the likely cause); the same view again
    // is applied.
    let out = step(
        &mut c,
        prefix(8, &[("canary", "drain", 5), ("web/a", "maint", 8)]),
    );
    assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
    let out = step(&mut c, Response::ReadCheck { allowed: true });
    assert_eq!(served(&c, "web/a"), Some(Maint));
    assert_eq!(asks(&out), &blocks_on(8));
    let out = step(
        &mut c,
        prefix(9, &[("canary", "drain", 5), ("web/a", "maint", 8)]),
    );
    assert_eq!(asks(&out), &blocks_on(0));
    let out = step(
        &mut c,
        prefix(9, &[("canary", "drain", 5), ("web/a", "maint", 8)]),
    );
    let out = match asks(&out) {
        Request::ReadCheck { .. } => step(&mut c, Response::ReadCheck { allowed: true }),
        _ => out,
    };
    assert_eq!(asks(&out), &blocks_on(9), "applied: no second fresh read");
}

#[test]
fn the_same_index_showing_other_keys_is_applied() {
    // A query parked under a narrower policy hid a key; the next one, at
    // the same index, shows it.
    let mut c = started(false, false, None);
    step(&mut c, prefix(5, &[("x", "ready", 5)]));
    let out = step(
        &mut c,
        prefix(5, &[("x", "ready", 5), ("canary", "drain", 5)]),
    );
    assert!(out.served_changed);
    // With ACLs off that is lost data: the drain that appeared caps.
    assert_eq!(answers(&c, &["canary"]), Some(Drain));
}

#[test]
fn the_same_index_with_a_key_rewritten_is_lost_data_but_a_filtered_view_is_not() {
    let mut c = started(true, false, None);
    step(
        &mut c,
        prefix(5, &[("canary", "drain", 5), ("x", "ready", 4)]),
    );
    step(&mut c, Response::ReadCheck { allowed: true });
    // A query parked under a narrower policy ends at the same index
    // without `canary`: read directly, not taken for lost data.
    let out = step(&mut c, prefix(5, &[("x", "ready", 4)]));
    assert!(!out.notes.iter().any(|n| matches!(n, Note::NotMoved { .. })));
    assert_eq!(asks(&out), &key("canary"));
    let present = Response::Key {
        read: KeyRead::Present(pair("canary", "drain", 5)),
        index: Some(5),
    };
    step(&mut c, present);
    no_store_id(&mut c, 5);
    assert_eq!(served(&c, "canary"), Some(Drain));
    assert_eq!(hold(&c, "canary"), None);
    // The same index with `canary` at another ModifyIndex: only a store
    // that lost data answers so.
    let out = step(
        &mut c,
        prefix(5, &[("canary", "ready", 3), ("x", "ready", 4)]),
    );
    assert!(out.notes.contains(&Note::NotMoved { index: 5 }));
    assert_eq!(served(&c, "canary"), Some(Drain));
    assert_eq!(hold(&c, "canary"), Some(HoldCause::RolledBack));
    // With ACLs off nothing is filtered: any other view is lost data.
    let mut c = started(false, false, None);
    step(
        &mut c,
        prefix(5, &[("canary", "drain", 5), ("x", "ready", 4)]),
    );
    let out = step(&mut c, prefix(5, &[("x", "ready", 4)]));
    assert!(out.notes.contains(&Note::NotMoved { index: 5 }));
    assert_eq!(served(&c, "canary"), Some(Drain));
}

#[test]
fn an_answer_filtered_by_an_older_policy_is_read_once_more() {
    // A query parked under a policy that hid the whole prefix wakes on a
    // write to a key the state does not hold: it shows nothing, the keys
    // it lacked are all present, and its index is past every ModifyIndex
    // seen: it may hide that write. One fresh read shows it.
    let mut c = started(true, false, None);
    step(
        &mut c,
        prefix(33, &[("canary", "256%", 28), ("web/web-03", "50", 33)]),
    );
    step(&mut c, Response::ReadCheck { allowed: true });
    let out = step(&mut c, prefix(35, &[]));
    assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
    let out = step(&mut c, Response::ReadCheck { allowed: true });
    assert_eq!(asks(&out), &key("web/web-03"));
    let present = |k, v, m| Response::Key {
        read: KeyRead::Present(pair(k, v, m)),
        index: Some(m),
    };
    let out = step(&mut c, present("web/web-03", "50", 33));
    assert_eq!(asks(&out), &key("canary"));
    let out = step(&mut c, present("canary", "256%", 28));
    assert_eq!(asks(&out), &key("~store-id"));
    let out = no_store_id(&mut c, 35);
    assert!(out.notes.contains(&Note::Refused(Refused::HidesWrites)));
    assert_eq!(asks(&out), &blocks_on(0));
    let out = step(
        &mut c,
        prefix(
            35,
            &[
                ("canary", "256%", 28),
                ("web/web-03", "50", 33),
                ("web/web-04", "drain", 35),
            ],
        ),
    );
    assert_eq!(served(&c, "web/web-04"), Some(Drain));
    assert_eq!(asks(&out), &blocks_on(35));
}

fn record(by: &str, value: &str, at: u64, until: Option<u64>) -> String {
    serde_json::to_string(&crate::model::meta::KeyMeta {
        by: by.into(),
        reason: "kernel upgrade".into(),
        at,
        until,
        value: value.into(),
    })
    .unwrap()
}

fn meta_of(core: &Core, key: &str) -> Option<String> {
    let r = core.served()?.keys.get(key)?;
    r.meta.as_ref().map(|m| m.by.clone())
}

fn out_keys(core: &Core) -> Vec<(String, AdminState, u64, Option<u64>)> {
    core.served()
        .unwrap()
        .out_keys()
        .into_iter()
        .map(|k| (k.key.to_string(), k.state, k.since, k.until))
        .collect()
}

#[test]
fn writer_records_are_never_keys_invalid_values_or_holds() {
    let good = record("alice", "drain", 500, Some(9_000));
    for acl in [false, true] {
        let mut c = started(acl, false, None);
        let pairs = [
            ("~meta/", "", 3),
            ("~meta/canary", good.as_str(), 10),
            ("~meta/web/s1", "not json", 11),
            ("~meta/bad key", good.as_str(), 11),
            ("~meta/a/b/c", good.as_str(), 11),
            ("canary", "drain", 10),
        ];
        let out = step(&mut c, prefix(11, &pairs));
        if acl {
            // The read check of the first answer, then the merge.
            assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
            step(&mut c, Response::ReadCheck { allowed: true });
        }
        let s = c.served().unwrap();
        assert_eq!(s.keys.keys().map(|k| &**k).collect::<Vec<_>>(), ["canary"]);
        assert_eq!(s.consul_key_count(), 1);
        assert_eq!(s.invalid_count(), 0);
        for cause in HoldCause::ALL {
            assert_eq!(s.held_count(cause), 0);
        }
        assert_eq!(s.invalid_meta, 3, "malformed, and two below no identity");
        let snap = s.snapshot();
        assert_eq!(snap.keys.len(), 1);
        assert_eq!(snap.invalid_count(), 0);
        assert_eq!(
            snap.lookup(["~meta/canary"]),
            Answer::State {
                state: Ready,
                decided_by: None
            }
        );
        assert_eq!(meta_of(&c, "canary").as_deref(), Some("alice"));
        // An answer that changes only a record is still an answer at a new
        // index: applied, no key changes.
        let newer = record("bob", "drain", 600, None);
        let mut pairs = pairs.to_vec();
        pairs[1] = ("~meta/canary", newer.as_str(), 12);
        let out = step(&mut c, prefix(12, &pairs));
        assert!(
            out.notes.contains(&Note::Applied {
                index: 12,
                changes: vec![]
            }),
            "{out:?}"
        );
        assert_eq!(meta_of(&c, "canary").as_deref(), Some("bob"));
    }
}

#[test]
fn a_record_names_the_write_it_came_with_and_since_counts_from_it() {
    let mut c = started(false, false, None);
    let rec = record("alice", "drain", 500, Some(9_000));
    // Written together by the writer: one ModifyIndex.
    c.on_response(
        prefix(
            10,
            &[
                ("canary", "drain", 10),
                ("~meta/canary", rec.as_str(), 10),
                ("web/s1", "maint", 9),
                ("web/s2", "ready", 9),
                ("web/s3", "50%", 9),
            ],
        ),
        1_000,
    );
    assert_eq!(meta_of(&c, "canary").as_deref(), Some("alice"));
    assert_eq!(meta_of(&c, "web/s1"), None, "no record: written by hand");
    assert_eq!(
        out_keys(&c),
        vec![
            ("canary".into(), Drain, 500, Some(9_000)),
            ("web/s1".into(), Maint, 1_000, None),
            ("web/s3".into(), Weight(50), 1_000, None),
        ],
        "ready keys are not out; oldest first"
    );
    // Later answers that leave web/s1 alone keep its since.
    c.on_response(
        prefix(
            11,
            &[
                ("canary", "drain", 10),
                ("~meta/canary", rec.as_str(), 10),
                ("web/s1", "maint", 9),
                ("web/s3", "50%", 9),
                ("zone", "ready", 11),
            ],
        ),
        2_000,
    );
    assert_eq!(out_keys(&c)[1], ("web/s1".into(), Maint, 1_000, None));
    // `consul kv put canary maint`: the key moves past its record.
    c.on_response(
        prefix(
            12,
            &[
                ("canary", "maint", 12),
                ("~meta/canary", rec.as_str(), 10),
                ("web/s1", "maint", 9),
            ],
        ),
        3_000,
    );
    assert_eq!(meta_of(&c, "canary"), None);
    assert_eq!(
        out_keys(&c),
        vec![
            ("web/s1".into(), Maint, 1_000, None),
            ("canary".into(), Maint, 3_000, None),
        ]
    );
    // The writer writes maint over maint: Consul keeps the key's index, the
    // newer record describes it.
    let rec2 = record("bob", "maint", 3_500, Some(4_000));
    c.on_response(
        prefix(
            13,
            &[
                ("canary", "maint", 12),
                ("~meta/canary", rec2.as_str(), 13),
                ("web/s1", "maint", 9),
            ],
        ),
        3_600,
    );
    assert_eq!(meta_of(&c, "canary").as_deref(), Some("bob"));
    assert_eq!(
        out_keys(&c)[1],
        ("canary".into(), Maint, 3_500, Some(4_000))
    );
    // A record that names another value describes nothing.
    let wrong = record("carol", "drain", 3_700, None);
    c.on_response(
        prefix(
            14,
            &[
                ("canary", "maint", 12),
                ("~meta/canary", wrong.as_str(), 14),
                ("web/s1", "maint", 9),
            ],
        ),
        3_800,
    );
    assert_eq!(meta_of(&c, "canary"), None);
    assert_eq!(
        out_keys(&c)[1],
        ("canary".into(), Maint, 3_000, None),
        "since this agent first served maint"
    );

    // Since and records survive a restart through the state file.
    let file = c.served().unwrap().to_file("p/");
    let restored = ServedState::from_file("p/", &file).unwrap();
    assert_eq!(&restored, c.served().unwrap());
    assert_eq!(
        restored.keys["web/s1"].since, 1_000,
        "web/s1 kept its since in the file"
    );
}

#[test]
fn a_held_key_keeps_its_record_and_its_since() {
    let mut c = started(false, false, None);
    let rec = record("alice", "drain", 500, Some(9_000));
    c.on_response(
        prefix(
            10,
            &[
                ("~store-id", "a1", 2),
                ("canary", "drain", 10),
                ("~meta/canary", rec.as_str(), 10),
            ],
        ),
        1_000,
    );
    // The store lost its data: canary vanished, held rolled back.
    c.on_response(prefix(4, &[]), 2_000);
    assert_eq!(hold(&c, "canary"), Some(HoldCause::RolledBack));
    assert_eq!(meta_of(&c, "canary").as_deref(), Some("alice"));
    assert_eq!(
        out_keys(&c),
        vec![("canary".into(), Drain, 500, Some(9_000))]
    );
}

#[test]
fn a_key_only_its_writer_record_names_is_read_and_if_forbidden_held_at_the_state_the_record_names()
{
    let rec = record("alice", "maint", 500, None);
    let answer = |index| {
        prefix(
            index,
            &[
                ("~store-id", "a1", 2),
                ("canary", "ready", 3),
                ("~meta/web/s2", rec.as_str(), 4),
                ("~meta/web/s3", rec.as_str(), 5),
            ],
        )
    };
    // A fresh agent (no state file); the token may read the prefix but not
    // web/s2 (`key ".../web/s2" deny`): the answer lacks it, its record
    // names it. web/s3 was deleted by hand, leaving its record.
    let mut c = started(true, false, None);
    let out = step(&mut c, answer(5));
    assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
    let out = step(&mut c, Response::ReadCheck { allowed: true });
    assert_eq!(asks(&out), &key("web/s3"));
    let out = key_read(&mut c, KeyRead::Absent, 5);
    assert_eq!(asks(&out), &key("web/s2"));
    let out = key_read(&mut c, KeyRead::Forbidden, 5);
    assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
    let out = step(&mut c, Response::ReadCheck { allowed: true });
    // web/s3's 404 is confirmed by the store id, as every 404 is.
    assert_eq!(asks(&out), &key("~store-id"));
    let out = key_read(&mut c, KeyRead::Present(pair("~store-id", "a1", 2)), 2);
    assert_eq!(asks(&out), &blocks_on(5));
    assert_eq!(hold(&c, "web/s2"), Some(HoldCause::Hidden));
    let snapshot = c.served().unwrap().snapshot();
    assert_eq!(
        snapshot.lookup(["web/s2", "canary"]),
        Answer::State {
            state: Maint,
            decided_by: Some(0)
        },
        "the maint its record names"
    );
    assert_eq!(
        snapshot.lookup(["web/s1", "canary"]),
        Answer::State {
            state: Ready,
            decided_by: Some(1)
        }
    );
    // Unrelated changes: web/s2 is read again each time (held hidden) and
    // stays hidden while the read is a 403; web/s3's record is not read
    // again (its key was absent at this record's index).
    for index in [6, 7] {
        let out = step(
            &mut c,
            prefix(
                index,
                &[
                    ("~store-id", "a1", 2),
                    ("canary", "ready", index),
                    ("~meta/web/s2", rec.as_str(), 4),
                    ("~meta/web/s3", rec.as_str(), 5),
                ],
            ),
        );
        let out = if asks(&out) == &(Request::ReadCheck { stale: false }) {
            step(&mut c, Response::ReadCheck { allowed: true })
        } else {
            out
        };
        assert_eq!(asks(&out), &key("web/s2"), "at {index}");
        let out = key_read(&mut c, KeyRead::Forbidden, index);
        assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
        step(&mut c, Response::ReadCheck { allowed: true });
        assert_eq!(hold(&c, "web/s2"), Some(HoldCause::Hidden), "at {index}");
        assert_eq!(
            c.served().unwrap().snapshot().lookup(["web/s2", "canary"]),
            Answer::State {
                state: Maint,
                decided_by: Some(0)
            },
            "at {index}"
        );
    }
    // Once readable, web/s2's value applies.
    let out = step(
        &mut c,
        prefix(
            8,
            &[
                ("~store-id", "a1", 2),
                ("canary", "ready", 8),
                ("~meta/web/s2", rec.as_str(), 4),
                ("~meta/web/s3", rec.as_str(), 5),
            ],
        ),
    );
    // (The token was read again after the 403: its read access is checked
    // once more.)
    assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
    let out = step(&mut c, Response::ReadCheck { allowed: true });
    assert_eq!(asks(&out), &key("web/s2"));
    let out = key_read(&mut c, KeyRead::Present(pair("web/s2", "maint", 4)), 4);
    assert_eq!(asks(&out), &key("~store-id"));
    let out = key_read(&mut c, KeyRead::Present(pair("~store-id", "a1", 2)), 2);
    assert_eq!(asks(&out), &blocks_on(8));
    assert_eq!(served(&c, "web/s2"), Some(Maint));
    assert_eq!(hold(&c, "web/s2"), None);
}

#[test]
fn a_token_denied_the_store_id_checks_direct_reads_without_it() {
    // The token may read the prefix but not `~store-id`: no answer shows it,
    // and its read after a direct read is a 403. The answer is applied
    // (not read again without end).
    let mut c = started(true, false, None);
    step(&mut c, prefix(5, &[("canary", "drain", 5)]));
    step(&mut c, Response::ReadCheck { allowed: true });
    let out = step(&mut c, prefix(9, &[("x", "ready", 9)]));
    assert_eq!(asks(&out), &key("canary"));
    let out = key_read(&mut c, KeyRead::Absent, 9);
    assert_eq!(asks(&out), &key("~store-id"));
    let out = key_read(&mut c, KeyRead::Forbidden, 9);
    assert_eq!(asks(&out), &blocks_on(9));
    assert_eq!(served(&c, "canary"), None);
}

#[test]
fn a_hidden_key_known_by_its_record_keeps_its_state_through_an_answer_from_a_store_that_lost_data()
{
    let rec = record("alice", "maint", 500, None);
    let mut c = started(true, false, None);
    let out = step(
        &mut c,
        prefix(
            5,
            &[
                ("~store-id", "a1", 2),
                ("canary", "ready", 3),
                ("~meta/web/s2", rec.as_str(), 4),
            ],
        ),
    );
    assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
    step(&mut c, Response::ReadCheck { allowed: true });
    key_read(&mut c, KeyRead::Forbidden, 5);
    step(&mut c, Response::ReadCheck { allowed: true });
    assert_eq!(hold(&c, "web/s2"), Some(HoldCause::Hidden));
    // Consul answers from an older snapshot (the index went backwards,
    // canary back at an older write): no direct reads are made of such an
    // answer, and web/s2 must not fall back to canary's ready meanwhile.
    let out = step(
        &mut c,
        prefix(
            4,
            &[
                ("~store-id", "a1", 2),
                ("canary", "ready", 1),
                ("~meta/web/s2", rec.as_str(), 4),
            ],
        ),
    );
    assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
    let out = step(&mut c, Response::ReadCheck { allowed: true });
    assert!(out.notes.iter().any(|n| matches!(n, Note::Applied { .. })));
    assert!(hold(&c, "web/s2").is_some());
    assert_eq!(
        c.served().unwrap().snapshot().lookup(["web/s2", "canary"]),
        Answer::State {
            state: Maint,
            decided_by: Some(0)
        }
    );
}

/// A generation value: number `n`, ids newest first.
fn generation(n: u64, ids: &[u64]) -> String {
    crate::model::generation::Generation {
        number: n,
        ids: ids.to_vec(),
    }
    .to_string()
}

#[test]
fn a_restored_snapshot_is_seen_by_its_generation_whatever_is_written_after_it() {
    let mut c = started(false, false, None);
    // web/s2 maint (generation 1), then web/s1 drain (generation 2).
    let g1 = generation(1, &[0xa]);
    let g2 = generation(2, &[0xb, 0xa]);
    step(
        &mut c,
        prefix(
            15,
            &[
                ("~generation", &g2, 15),
                ("web/s2", "maint", 12),
                ("web/s1", "drain", 15),
            ],
        ),
    );
    assert_eq!(served(&c, "web/s1"), Some(Drain));
    // The snapshot from generation 1 is restored (web/s1 gone), then
    // web/s3 is drained: generation 2 again, on another branch, at an
    // index past the one served.
    let g2_other = generation(2, &[0xc, 0xa]);
    let _ = g1;
    let out = step(
        &mut c,
        prefix(
            21,
            &[
                ("~generation", &g2_other, 21),
                ("web/s2", "maint", 12),
                ("web/s3", "drain", 21),
            ],
        ),
    );
    assert!(out
        .notes
        .iter()
        .any(|n| matches!(n, Note::GenerationLost { .. })));
    assert_eq!(served(&c, "web/s1"), Some(Drain));
    assert_eq!(hold(&c, "web/s1"), Some(HoldCause::RolledBack));
    // Appeared from the other branch: it caps, and nothing later is less.
    assert_eq!(answers(&c, &["web/s3", "zone-b"]), Some(Drain));
    // The next writer transaction descends from the new branch: nothing
    // more is lost, and the hold stays until web/s1 is written.
    let g3 = generation(3, &[0xd, 0xc, 0xa]);
    let out = step(
        &mut c,
        prefix(
            22,
            &[
                ("~generation", &g3, 22),
                ("web/s2", "maint", 12),
                ("web/s3", "ready", 22),
            ],
        ),
    );
    assert!(!out
        .notes
        .iter()
        .any(|n| matches!(n, Note::GenerationLost { .. })));
    assert_eq!(hold(&c, "web/s1"), Some(HoldCause::RolledBack));
    // A generation too many writes ahead to link says nothing either way.
    let mut far = crate::model::generation::Generation::first(0xd);
    for i in 0..100 {
        far = far.next(0x100 + i);
    }
    let far = far.to_string();
    let out = step(
        &mut c,
        prefix(30, &[("~generation", &far, 30), ("web/s2", "maint", 12)]),
    );
    assert!(!out
        .notes
        .iter()
        .any(|n| matches!(n, Note::GenerationLost { .. })));
}

#[test]
fn a_vanished_generation_is_lost_data_and_a_malformed_one_says_nothing() {
    let mut c = started(false, false, None);
    let g1 = generation(1, &[0xa]);
    step(
        &mut c,
        prefix(5, &[("~generation", &g1, 5), ("canary", "maint", 4)]),
    );
    let out = step(
        &mut c,
        prefix(7, &[("~generation", "junk", 7), ("canary", "maint", 4)]),
    );
    assert!(!out
        .notes
        .iter()
        .any(|n| matches!(n, Note::GenerationLost { .. })));
    // The generation served is kept through the junk value.
    assert_eq!(c.served().unwrap().generation.map(|g| g.number), Some(1));
    let out = step(&mut c, prefix(9, &[("other", "x", 9)]));
    assert!(out.notes.contains(&Note::GenerationLost {
        served: crate::model::generation::GenerationMark { number: 1, id: 0xa },
        now: None
    }));
    assert_eq!(served(&c, "canary"), Some(Maint));
    assert_eq!(hold(&c, "canary"), Some(HoldCause::RolledBack));
}

#[test]
fn an_index_that_goes_back_with_nothing_moved_is_a_reaped_tombstone() {
    let mut c = started(false, false, None);
    step(
        &mut c,
        prefix(13, &[("web/s1", "drain", 12), ("canary", "maint", 13)]),
    );
    // canary deleted by hand: its tombstone keeps the index at 20.
    step(&mut c, prefix(20, &[("web/s1", "drain", 12)]));
    assert_eq!(served(&c, "canary"), None);
    // About 15 minutes later Consul reaps it: the index drops to 12,
    // nothing else changes. Not a loss: no hold, and the index is taken.
    let out = step(&mut c, prefix(12, &[("web/s1", "drain", 12)]));
    assert!(out.notes.contains(&Note::IndexReset {
        previous: 20,
        index: 12,
        reaped: true
    }));
    assert_eq!(c.served().unwrap().held_count(HoldCause::RolledBack), 0);
    assert_eq!(c.served().unwrap().index, 12);
    // A lower index with a key gone is still lost data: a delete's
    // tombstone would have kept the index up.
    step(
        &mut c,
        prefix(25, &[("web/s1", "drain", 12), ("zone-b", "maint", 25)]),
    );
    let out = step(&mut c, prefix(14, &[("web/s1", "drain", 12)]));
    assert!(out.notes.contains(&Note::IndexReset {
        previous: 25,
        index: 14,
        reaped: false
    }));
    assert_eq!(served(&c, "zone-b"), Some(Maint));
    assert_eq!(hold(&c, "zone-b"), Some(HoldCause::RolledBack));
}

/// Answers the direct reads that follow `out` with 403 (at `index`) and
/// the read checks with a pass, until the core asks for something else.
fn forbid_direct_reads(c: &mut Core, mut out: Output, index: u64) {
    for _ in 0..6 {
        out = match asks(&out) {
            Request::Key { .. } => key_read(c, KeyRead::Forbidden, index),
            Request::ReadCheck { .. } => step(c, Response::ReadCheck { allowed: true }),
            _ => return,
        };
    }
}

#[test]
fn a_hidden_key_holds_its_drain_or_maint_and_a_hidden_ready_caps_the_next_identity() {
    let mut c = started(true, false, None);
    step(
        &mut c,
        prefix(
            10,
            &[
                ("web/s1", "ready", 8),
                ("web/s2", "maint", 9),
                ("canary", "ready", 10),
            ],
        ),
    );
    step(&mut c, Response::ReadCheck { allowed: true });
    // The policy gains a deny on web/s1 and web/s2; an unrelated write.
    let out = step(
        &mut c,
        prefix(11, &[("canary", "ready", 10), ("other", "x", 11)]),
    );
    forbid_direct_reads(&mut c, out, 11);
    assert_eq!(hold(&c, "web/s1"), Some(HoldCause::Hidden));
    assert_eq!(served(&c, "web/s1"), None);
    assert_eq!(hold(&c, "web/s2"), Some(HoldCause::Hidden));
    assert_eq!(served(&c, "web/s2"), Some(Maint));
    // web/s1 cleared meanwhile (unseen), then canary disabled: canary
    // decides web/s1's line; web/s2's own maint still decides its line.
    let out = step(
        &mut c,
        prefix(13, &[("canary", "maint", 13), ("other", "x", 11)]),
    );
    forbid_direct_reads(&mut c, out, 13);
    let snapshot = c.served().unwrap().snapshot();
    assert_eq!(
        snapshot.lookup(["web/s1", "canary"]),
        Answer::State {
            state: Maint,
            decided_by: Some(1)
        }
    );
    assert_eq!(
        snapshot.lookup(["web/s2", "canary"]),
        Answer::State {
            state: Maint,
            decided_by: Some(0)
        }
    );
    // Readable again: its value applies and the hold ends.
    let out = step(
        &mut c,
        prefix(
            14,
            &[
                ("web/s1", "drain", 14),
                ("canary", "maint", 13),
                ("other", "x", 11),
            ],
        ),
    );
    forbid_direct_reads(&mut c, out, 14);
    assert_eq!(served(&c, "web/s1"), Some(Drain));
    assert_eq!(hold(&c, "web/s1"), None);
}

#[test]
fn a_hidden_weight_caps_what_a_later_identity_answers() {
    let mut c = started(true, false, None);
    step(
        &mut c,
        prefix(10, &[("web/s3", "40%", 9), ("canary", "ready", 10)]),
    );
    step(&mut c, Response::ReadCheck { allowed: true });
    // The policy gains a deny on web/s3; an unrelated write.
    let out = step(
        &mut c,
        prefix(11, &[("canary", "ready", 10), ("other", "x", 11)]),
    );
    forbid_direct_reads(&mut c, out, 11);
    assert_eq!(hold(&c, "web/s3"), Some(HoldCause::Hidden));
    let snapshot = c.served().unwrap().snapshot();
    // Not canary's `ready`: the 40% it may still hold caps it.
    assert_eq!(
        snapshot.lookup(["web/s3", "canary"]),
        Answer::State {
            state: Weight(40),
            decided_by: Some(0)
        }
    );
    // A later drain is less, and decides.
    let out = step(
        &mut c,
        prefix(13, &[("canary", "drain", 13), ("other", "x", 11)]),
    );
    forbid_direct_reads(&mut c, out, 13);
    let snapshot = c.served().unwrap().snapshot();
    assert_eq!(
        snapshot.lookup(["web/s3", "canary"]),
        Answer::State {
            state: Drain,
            decided_by: Some(1)
        }
    );
}

fn check(index: u64, meta: ReadMeta) -> IndexCheck {
    IndexCheck::Answered { index, meta }
}

/// The note of a check that found the read behind, and what it did.
fn behind(parked: u64, index: u64, then: BehindStep) -> Vec<Note> {
    vec![Note::ParkedBehind {
        parked,
        index,
        then,
    }]
}

#[test]
fn a_read_reissued_for_being_behind_is_not_reissued_for_that_again() {
    let mut c = started(false, false, None);
    step(&mut c, prefix(10, &[("canary", "drain", 10)]));
    // Two checks behind: re-issued.
    assert_eq!(c.on_index_check(check(12, FRESH)).reissue, None);
    let out = c.on_index_check(check(12, FRESH));
    assert_eq!(out.reissue.map(|n| n.request), Some(blocks_on(10)));
    // The re-issued read asks at an index Consul is past: however long its
    // servers take to answer (a fleet's fan-out), it is on its way.
    // Re-issuing it again would drop that answer each time; every check is
    // still counted.
    for _ in 0..REPLACE_UNANSWERED_AFTER - 1 {
        let out = c.on_index_check(check(13, FRESH));
        assert_eq!(out.reissue, None);
        assert_eq!(out.notes, behind(10, 13, BehindStep::Waits));
    }
    // A cut-off server still re-issues it, once, as a default read, and it
    // stays a read re-issued for being behind, with checks of its own.
    let leaderless = ReadMeta {
        known_leader: Some(false),
        ..FRESH
    };
    let out = c.on_index_check(check(13, leaderless));
    assert_eq!(out.reissue.map(|n| n.request), Some(blocks_on(10)));
    assert_eq!(c.on_index_check(check(13, FRESH)).reissue, None);
    // Its answer starts the next read afresh: two checks behind re-issue
    // it again.
    step(&mut c, prefix(13, &[("canary", "maint", 13)]));
    assert_eq!(c.on_index_check(check(14, FRESH)).reissue, None);
    let out = c.on_index_check(check(14, FRESH));
    assert_eq!(out.reissue.map(|n| n.request), Some(blocks_on(13)));
}

#[test]
fn a_reissued_read_left_unanswered_while_checks_pass_is_replaced_by_a_full_read() {
    let mut c = started(false, false, None);
    step(&mut c, prefix(10, &[("canary", "ready", 10)]));
    // Consul moves to 12 (canary drained); the read is never answered (a
    // proxy or a server that withholds blocking answers). Every check is
    // counted, one note each.
    let out = c.on_index_check(check(12, FRESH));
    assert_eq!(out.notes, behind(10, 12, BehindStep::Waits));
    let out = c.on_index_check(check(12, FRESH));
    assert_eq!(out.notes, behind(10, 12, BehindStep::Reissued));
    assert_eq!(out.reissue.map(|n| n.request), Some(blocks_on(10)));
    for _ in 0..REPLACE_UNANSWERED_AFTER - 1 {
        let out = c.on_index_check(check(12, FRESH));
        assert_eq!(out.notes, behind(10, 12, BehindStep::Waits));
        assert_eq!((out.reissue, out.reroute), (None, false));
    }
    // The last: replaced by a full read, which does not park, and another
    // address asked for.
    let out = c.on_index_check(check(12, FRESH));
    assert_eq!(out.notes, behind(10, 12, BehindStep::Replaced));
    assert_eq!(
        out.reissue,
        Some(Next {
            request: blocks_on(0),
            delay: Delay::None
        })
    );
    assert!(out.reroute);
    assert!(!c.parked(), "a full read is not watched by checks");
    assert_eq!(c.on_index_check(check(12, FRESH)), CheckOutput::default());
    step(&mut c, prefix(12, &[("canary", "drain", 12)]));
    assert_eq!(served(&c, "canary"), Some(Drain));

    // With the rule off, the re-issued read is left to its timeout.
    let mut config = config(false);
    config.rules = config.rules.without(Rule::ReplaceUnanswered);
    let mut c = Core::new(config, None);
    c.start();
    step(&mut c, Response::Acl { enabled: false });
    step(&mut c, prefix(10, &[("canary", "ready", 10)]));
    for _ in 0..2 + 2 * REPLACE_UNANSWERED_AFTER {
        c.on_index_check(check(12, FRESH));
    }
    assert!(c.parked());
}

#[test]
fn an_index_check_below_the_parked_index_reads_again_from_0_by_default() {
    for stale in [false, true] {
        let mut c = started(false, stale, None);
        step(
            &mut c,
            prefix(
                30,
                &[
                    ("~store-id", "a", 3),
                    ("web/s1", "ready", 30),
                    ("web/s2", "maint", 12),
                ],
            ),
        );
        if stale {
            // The default read that confirmed the first, then stale ones.
            step(
                &mut c,
                prefix(
                    30,
                    &[
                        ("~store-id", "a", 3),
                        ("web/s1", "ready", 30),
                        ("web/s2", "maint", 12),
                    ],
                ),
            );
        }
        assert!(c.parked());
        // A snapshot from when web/s1 was drained is restored: Consul
        // holds the parked read until its wait ends; the check sees 20.
        let out = c.on_index_check(check(20, FRESH));
        assert_eq!(
            out.notes,
            vec![Note::IndexBelow {
                parked: 30,
                index: 20
            }]
        );
        assert_eq!(
            out.reissue.map(|n| n.request),
            Some(blocks_on(0)),
            "a full default read, stale {stale}"
        );
        let out = step(
            &mut c,
            prefix(
                20,
                &[
                    ("~store-id", "a", 3),
                    ("web/s1", "drain", 20),
                    ("web/s2", "maint", 12),
                ],
            ),
        );
        assert!(out.notes.contains(&Note::IndexReset {
            previous: 30,
            index: 20,
            reaped: false
        }));
        // Lost data: a drain that comes back is less traffic, and applies.
        assert_eq!(served(&c, "web/s1"), Some(Drain));
        assert_eq!(served(&c, "web/s2"), Some(Maint));
    }
    // A check from a server that lags: the read from 0 shows the parked
    // index itself. Later checks below are counted, and read from 0 again
    // only once a check has answered at the parked index.
    let mut c = started(false, true, None);
    step(&mut c, prefix(30, &[("web/s1", "ready", 30)]));
    step(&mut c, prefix(30, &[("web/s1", "ready", 30)]));
    let out = c.on_index_check(check(29, FRESH));
    assert_eq!(out.reissue.map(|n| n.request), Some(blocks_on(0)));
    let out = step(&mut c, prefix(30, &[("web/s1", "ready", 30)]));
    assert_eq!(
        asks(&out),
        &Request::Prefix {
            index: 30,
            stale: true
        }
    );
    for _ in 0..3 {
        let out = c.on_index_check(check(29, FRESH));
        assert_eq!(
            out.notes,
            vec![Note::IndexBelow {
                parked: 30,
                index: 29
            }]
        );
        assert_eq!(out.reissue, None);
    }
    assert_eq!(c.on_index_check(check(30, FRESH)).reissue, None);
    let out = c.on_index_check(check(29, FRESH));
    assert_eq!(out.reissue.map(|n| n.request), Some(blocks_on(0)));

    // With the rule off, the lower index is taken for current.
    let mut config = config(false);
    config.rules = config.rules.without(Rule::ResetBelow);
    let mut c = Core::new(config, None);
    c.start();
    step(&mut c, Response::Acl { enabled: false });
    step(&mut c, prefix(30, &[("web/s1", "ready", 30)]));
    let out = c.on_index_check(check(20, FRESH));
    assert!(matches!(out.notes[..], [Note::Confirmed { .. }]));
    assert_eq!(out.reissue, None);
}

#[test]
fn a_write_after_a_restore_from_before_the_generation_is_held_on_the_lower_side() {
    let mut c = started(false, false, None);
    let g2 = generation(2, &[0xb, 0xa]);
    step(
        &mut c,
        prefix(
            15,
            &[
                ("~store-id", "a", 3),
                ("~generation", &g2, 15),
                ("web/s1", "drain", 4),
                ("web/s2", "drain", 15),
            ],
        ),
    );
    // A snapshot from before the writer kept a generation is restored:
    // the index and keys went back, and the generation vanished. A loss,
    // once.
    let out = step(
        &mut c,
        prefix(9, &[("~store-id", "a", 3), ("web/s1", "drain", 4)]),
    );
    assert!(out
        .notes
        .iter()
        .any(|n| matches!(n, Note::GenerationLost { now: None, .. })));
    assert!(out
        .notes
        .iter()
        .any(|n| matches!(n, Note::IndexReset { reaped: false, .. })));
    assert_eq!(hold(&c, "web/s2"), Some(HoldCause::RolledBack));
    // The writer's next transaction starts a new history on the absent
    // key: web/s3 at 50%. The agent cannot tell it from a store rebuilt
    // ahead: a loss again, on the lower side: web/s3 caps its lines at
    // the 50% written.
    let g1 = generation(1, &[0xc]);
    let out = step(
        &mut c,
        prefix(
            40,
            &[
                ("~store-id", "a", 3),
                ("~generation", &g1, 40),
                ("web/s1", "drain", 4),
                ("web/s3", "50%", 40),
            ],
        ),
    );
    assert!(
        out.notes
            .iter()
            .any(|n| matches!(n, Note::GenerationLost { .. })),
        "{:?}",
        out.notes
    );
    assert_eq!(answers(&c, &["web/s3", "canary"]), Some(Weight(50)));
    assert_eq!(hold(&c, "web/s3"), Some(HoldCause::RolledBack));
    // The restore's own loss is still held.
    assert_eq!(served(&c, "web/s2"), Some(Drain));
    assert_eq!(hold(&c, "web/s2"), Some(HoldCause::RolledBack));
    // A generation restored (its old ModifyIndex) where none was shown is
    // still judged by its history, also by an agent restarted from its
    // state file in between (the file keeps that the generation had
    // vanished).
    let mut c = started(false, false, None);
    step(
        &mut c,
        prefix(15, &[("~store-id", "a", 3), ("~generation", &g2, 15)]),
    );
    step(&mut c, prefix(16, &[("~store-id", "a", 3)]));
    let text = c.served().unwrap().to_file("p/");
    let restored = ServedState::from_file("p/", &text).unwrap();
    assert!(!restored.generation_shown, "kept through the state file");
    let mut c = started(false, false, Some(restored));
    let out = step(&mut c, prefix(16, &[("~store-id", "a", 3)]));
    assert!(
        !out.notes
            .iter()
            .any(|n| matches!(n, Note::GenerationLost { .. })),
        "the vanishing is lost data once, not again after a restart"
    );
    let out = step(
        &mut c,
        prefix(
            30,
            &[
                ("~store-id", "a", 3),
                ("~generation", &generation(1, &[0xa]), 8),
            ],
        ),
    );
    assert!(out
        .notes
        .iter()
        .any(|n| matches!(n, Note::GenerationLost { .. })));
}

#[test]
fn an_index_check_reissues_a_query_parked_behind_or_on_a_cut_off_server() {
    let mut c = started(false, false, None);
    let out = step(&mut c, prefix(10, &[("canary", "drain", 10)]));
    assert_eq!(asks(&out), &blocks_on(10));
    assert!(c.parked());
    // Current: confirmed, nothing re-issued.
    let out = c.on_index_check(check(10, FRESH));
    assert_eq!(out.reissue, None);
    assert_eq!(
        out.notes,
        vec![Note::Confirmed {
            last_contact: Duration::from_millis(2)
        }]
    );
    // A failed check confirms nothing and keeps the read.
    let out = c.on_index_check(IndexCheck::Failed);
    assert_eq!(out.reissue, None);
    assert!(matches!(out.notes[0], Note::Unconfirmed { .. }));
    // The prefix moved past the parked read: once may be the read's own
    // answer on its way; twice, it is re-issued at once.
    let out = c.on_index_check(check(12, FRESH));
    assert_eq!(out.reissue, None);
    assert_eq!(out.notes, behind(10, 12, BehindStep::Waits));
    let out = c.on_index_check(check(12, FRESH));
    assert_eq!(
        out.reissue,
        Some(Next {
            request: blocks_on(10),
            delay: Delay::None
        })
    );
    assert_eq!(out.notes, behind(10, 12, BehindStep::Reissued));
    // The re-issued read answers: no read is parked until the next.
    let out = step(&mut c, prefix(12, &[("canary", "maint", 12)]));
    assert_eq!(served(&c, "canary"), Some(Maint));
    assert_eq!(asks(&out), &blocks_on(12));
    // A check from a server that knows no leader: re-issued (as a default
    // read, which such a server fails after rpc_hold_timeout), once.
    let leaderless = ReadMeta {
        known_leader: Some(false),
        ..FRESH
    };
    let out = c.on_index_check(check(12, leaderless));
    assert_eq!(out.reissue.map(|n| n.request), Some(blocks_on(12)));
    assert_eq!(
        out.notes,
        vec![Note::Unconfirmed {
            reason: Unconfirmed::CutOff(HoldReason::NoLeader)
        }]
    );
    assert_eq!(c.on_index_check(check(12, leaderless)).reissue, None);
    // A check that comes after the read returned is ignored.
    step(&mut c, Response::Failed { forbidden: false });
    assert!(!c.parked());
    assert_eq!(c.on_index_check(check(20, FRESH)), CheckOutput::default());
}

#[test]
fn in_stale_mode_a_check_from_a_cut_off_server_reissues_a_default_read() {
    let mut c = started(false, true, None);
    step(&mut c, prefix(10, &[("canary", "drain", 10)]));
    let out = step(&mut c, prefix(10, &[("canary", "drain", 10)]));
    assert_eq!(
        asks(&out),
        &Request::Prefix {
            index: 10,
            stale: true
        }
    );
    let old = ReadMeta {
        last_contact: Some(Duration::from_secs(9)),
        ..FRESH
    };
    let out = c.on_index_check(check(10, old));
    assert_eq!(out.reissue.map(|n| n.request), Some(blocks_on(10)));
}

#[test]
fn a_writer_transaction_with_acls_on_lists_the_records_and_reads_the_keys_they_name() {
    let g = |n: u64| format!("{n} {:016x}", n);
    let names = |ks: &[&str]| Response::RecordNames {
        names: Some(ks.iter().map(|k| (*k).into()).collect()),
        index: None,
    };
    // (ACLs, rule on, the writer's transaction also wrote the visible x)
    for (acl, rule, with_x) in [
        (true, true, false),
        (true, true, true),
        (true, false, false),
        (false, true, false),
    ] {
        let case = format!("acl {acl}, rule {rule}, x {with_x}");
        let mut cfg = config(false);
        if !rule {
            cfg.rules = cfg.rules.without(Rule::ListRecords);
        }
        let mut c = Core::new(cfg, None);
        c.start();
        c.on_response(Response::Acl { enabled: acl }, 0);
        // The first answer (the writer's first transaction at 3): with
        // ACLs on, the records are listed; none names an unknown key.
        let first = [
            ("~store-id", "a1", 2),
            ("~generation", g(1).leak() as &str, 3),
            ("canary", "ready", 3),
        ];
        let out = step(&mut c, prefix(3, &first));
        let out = if acl {
            assert_eq!(asks(&out), &Request::ReadCheck { stale: false }, "{case}");
            let out = step(&mut c, Response::ReadCheck { allowed: true });
            match rule {
                true => {
                    assert_eq!(asks(&out), &Request::RecordNames { stale: false }, "{case}");
                    step(&mut c, names(&["canary"]))
                }
                false => out,
            }
        } else {
            out
        };
        assert_eq!(asks(&out), &blocks_on(3), "{case}");
        // The new writer drains web/s2, which the token may not read, in
        // one transaction with its record (beside the prefix, in no answer)
        // and the generation: the answer's index is the generation's.
        let g2 = g(2);
        let mut second = vec![
            ("~store-id", "a1", 2),
            ("~generation", g2.as_str(), 7),
            ("canary", "ready", 3),
        ];
        if with_x {
            second.push(("x", "ready", 7));
        }
        let out = step(&mut c, prefix(7, &second));
        if !(acl && rule) {
            // ACLs off: nothing is hidden, and nothing is listed (one
            // request a change). Rule off: web/s2 is never found.
            assert_eq!(asks(&out), &blocks_on(7), "{case}");
            assert_eq!(hold(&c, "web/s2"), None, "{case}");
            continue;
        }
        assert_eq!(asks(&out), &Request::RecordNames { stale: false }, "{case}");
        let listed: &[&str] = match with_x {
            true => &["canary", "web/s2", "x"],
            false => &["canary", "web/s2"],
        };
        let out = step(&mut c, names(listed));
        assert_eq!(asks(&out), &key("web/s2"), "{case}");
        let out = key_read(&mut c, KeyRead::Forbidden, 7);
        // Its record says what the writer wrote.
        assert_eq!(
            asks(&out),
            &Request::Record {
                key: "web/s2".into()
            },
            "{case}"
        );
        let rec = record("alice", "drain", 500, None);
        let out = key_read(&mut c, KeyRead::Present(pair("web/s2", &rec, 7)), 7);
        assert_eq!(asks(&out), &Request::ReadCheck { stale: false }, "{case}");
        let out = step(&mut c, Response::ReadCheck { allowed: true });
        assert_eq!(asks(&out), &blocks_on(7), "{case}");
        assert_eq!(hold(&c, "web/s2"), Some(HoldCause::Hidden), "{case}");
        assert_eq!(
            c.served().unwrap().snapshot().lookup(["web/s2", "canary"]),
            Answer::State {
                state: Drain,
                decided_by: Some(0)
            },
            "{case}: the drain written, not canary's ready"
        );
        // A change by hand (no writer transaction) lists nothing; the
        // hidden key is read again as every held hidden key is.
        let mut third = second.clone();
        third[2] = ("canary", "ready", 9);
        let out = step(&mut c, prefix(9, &third));
        let out = if asks(&out) == &(Request::ReadCheck { stale: false }) {
            step(&mut c, Response::ReadCheck { allowed: true })
        } else {
            out
        };
        assert_eq!(asks(&out), &key("web/s2"), "{case}");
        let out = key_read(&mut c, KeyRead::Forbidden, 9);
        assert_eq!(asks(&out), &Request::ReadCheck { stale: false }, "{case}");
        step(&mut c, Response::ReadCheck { allowed: true });
        // The writer writes the hidden key again (maint): its record, read
        // after the listing, names the new state.
        let g3 = g(3);
        let mut fourth = third.clone();
        fourth[1] = ("~generation", g3.as_str(), 11);
        let out = step(&mut c, prefix(11, &fourth));
        let out = if asks(&out) == &(Request::ReadCheck { stale: false }) {
            step(&mut c, Response::ReadCheck { allowed: true })
        } else {
            out
        };
        assert_eq!(asks(&out), &Request::RecordNames { stale: false }, "{case}");
        let out = step(&mut c, names(listed));
        assert_eq!(asks(&out), &key("web/s2"), "{case}");
        let out = key_read(&mut c, KeyRead::Forbidden, 11);
        assert_eq!(
            asks(&out),
            &Request::Record {
                key: "web/s2".into()
            },
            "{case}"
        );
        let rec = record("alice", "maint", 600, None);
        let out = key_read(&mut c, KeyRead::Present(pair("web/s2", &rec, 11)), 11);
        assert_eq!(asks(&out), &Request::ReadCheck { stale: false }, "{case}");
        step(&mut c, Response::ReadCheck { allowed: true });
        assert_eq!(answers(&c, &["web/s2", "canary"]), Some(Maint), "{case}");
    }
}

#[test]
fn records_the_token_may_not_list_are_noted_and_the_answer_applies() {
    let mut c = started(true, false, None);
    let out = step(
        &mut c,
        prefix(
            3,
            &[("~generation", "1 0000000000000001", 3), ("a", "drain", 3)],
        ),
    );
    assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
    let out = step(&mut c, Response::ReadCheck { allowed: true });
    assert_eq!(asks(&out), &Request::RecordNames { stale: false });
    let out = step(
        &mut c,
        Response::RecordNames {
            names: None,
            index: Some(3),
        },
    );
    assert!(out.notes.contains(&Note::RecordsListed {
        unknown: 0,
        denied: true
    }));
    assert_eq!(asks(&out), &blocks_on(3));
    assert_eq!(served(&c, "a"), Some(Drain));
}

#[test]
fn a_hidden_key_whose_record_is_gone_when_read_is_left_out() {
    // The writer deleted the key and its record between the listing and
    // the record's read: nothing is known of it, and it is not held with
    // no value (which would answer nothing and keep HAProxy's state).
    let mut c = started(true, false, None);
    step(
        &mut c,
        prefix(
            3,
            &[
                ("~generation", "1 0000000000000001", 3),
                ("canary", "drain", 3),
            ],
        ),
    );
    step(&mut c, Response::ReadCheck { allowed: true });
    let out = step(
        &mut c,
        Response::RecordNames {
            names: Some(vec!["web/s2".into()]),
            index: None,
        },
    );
    assert_eq!(asks(&out), &key("web/s2"));
    let out = key_read(&mut c, KeyRead::Forbidden, 3);
    assert_eq!(
        asks(&out),
        &Request::Record {
            key: "web/s2".into()
        }
    );
    let out = key_read(&mut c, KeyRead::Absent, 4);
    assert_eq!(asks(&out), &Request::ReadCheck { stale: false });
    step(&mut c, Response::ReadCheck { allowed: true });
    assert_eq!(hold(&c, "web/s2"), None);
    assert_eq!(answers(&c, &["web/s2", "canary"]), Some(Drain));
}

#[test]
fn a_stale_listing_behind_the_writers_transaction_is_asked_of_the_leader() {
    // (the stale listing's index, asked of the leader after)
    for (index, again) in [
        (Some(2), true),
        (None, true),
        (Some(3), false),
        (Some(9), false),
    ] {
        let mut c = started(true, true, None);
        step(
            &mut c,
            prefix(
                3,
                &[("~generation", "1 0000000000000001", 3), ("a", "drain", 3)],
            ),
        );
        let out = step(&mut c, Response::ReadCheck { allowed: true });
        assert_eq!(
            asks(&out),
            &Request::RecordNames { stale: false },
            "first: default"
        );
        step(
            &mut c,
            Response::RecordNames {
                names: Some(vec![]),
                index: Some(3),
            },
        );
        let out = step(
            &mut c,
            prefix(
                7,
                &[
                    ("~generation", "2 0000000000000002 0000000000000001", 7),
                    ("a", "drain", 7),
                ],
            ),
        );
        assert_eq!(
            asks(&out),
            &Request::RecordNames { stale: true },
            "{index:?}"
        );
        let out = step(
            &mut c,
            Response::RecordNames {
                names: Some(vec![]),
                index: index.map(|i| i + 4),
            },
        );
        match again {
            true => assert_eq!(
                asks(&out),
                &Request::RecordNames { stale: false },
                "{index:?}"
            ),
            false => assert!(matches!(asks(&out), Request::Prefix { .. }), "{index:?}"),
        }
    }
}
