//! The reports as the writer prints them, text and JSON.

use std::time::Duration;

use serde_json::json;

use super::*;

use crate::cli::RampArgs;
use crate::model::marks::DRAIN_FLAGS;
use crate::model::snapshot::build_snapshot;
use crate::writer::haproxy;
use crate::writer::plan::{currents, plan_drain, plan_undrain, WaitFor};
use crate::writer::select::tests::{selector, CONFIG};

#[test]
fn set_by_column_names_the_drain_mark() {
    assert_eq!(set_by("web/a", DRAIN_FLAGS), "drain");
    assert_eq!(set_by("web/a", 0), "hand");
    assert_eq!(set_by("web/a", 42), "hand (flags 42)");
    // An earlier version's mark, with its selection id.
    assert_eq!(set_by("web/a", 0x2469_579b), "drain (flags 610883483)");
    // Group keys have no set-by-hand rule.
    for flags in [0, DRAIN_FLAGS, 15, 42] {
        assert_eq!(set_by("canary", flags), "-");
    }
}

fn pair(key: &str, value: &[u8], flags: u64) -> KvPair {
    KvPair {
        key: format!("p/{key}"),
        value: value.to_vec(),
        modify_index: 5,
        flags,
    }
}

#[test]
fn report_names_servers_left_alone_because_set_by_hand() {
    let select = selector(None, Some("web"), None);
    let target = Target::select(haproxy::parse_config(CONFIG), &select, None, "cfg".into());
    let pairs = [
        pair("web/web-01", b"maint", 0),
        pair("web/web-02", b"maint", DRAIN_FLAGS),
    ];
    let plan = plan_undrain(
        currents("p/", &pairs, &target.keys),
        Duration::ZERO,
        &RampArgs::default(),
    )
    .unwrap();
    let run = Run::new(&plan, 9);
    let snapshot = Snapshot::default();
    let report = Report {
        action: "undrain",
        dry_run: true,
        plan: &plan,
        run: &run,
        target: &target,
        snapshot: &snapshot,
        failure: None,
    };
    let text = report.model().text();
    assert!(
        text.starts_with("undrain: dry run, nothing written; the plan; 1 server set by hand"),
        "{text}"
    );
    assert!(
        text.contains("1 server left alone: its key was set by hand"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("web/web-01") && l.ends_with(" 5"))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["web/web-01", "web/web-01", "maint", "0", "5"]
    );
    assert!(text.contains("web/web-tpl1  server-template"), "{text}");
    let v = serde_json::to_value(report.model()).unwrap();
    assert_eq!(
        v["set_by_hand"],
        json!([{"server": "web/web-01", "key": "web/web-01", "value": "maint", "flags": 0}])
    );
    let keys = v["keys"].as_array().unwrap();
    assert_eq!(keys[0]["set_by_hand"], true);
    assert_eq!(keys[1]["by_drain"], true);
    assert_eq!(keys[1]["set_by_hand"], false);
}

#[test]
fn a_group_drain_names_row_keys_that_decide_first() {
    let pairs = [
        pair("web/web-02", b"50%", 0),
        pair("web/web-09", b"maint", 0),
        pair("canary", b"ready", 0),
    ];
    let snapshot = build_snapshot("p/", 9, &pairs);
    // With the configuration: per server, the row key decides first.
    let select = selector(Some("b"), None, None);
    let target = Target::select(
        haproxy::parse_config(CONFIG),
        &select,
        Some("zone-b".into()),
        "cfg".into(),
    );
    let plan = plan_drain(
        currents("p/", &pairs, &target.keys),
        Duration::ZERO,
        WaitFor::Drain,
    );
    let run = Run::new(&plan, 9);
    let report = Report {
        action: "drain",
        dry_run: true,
        plan: &plan,
        run: &run,
        target: &target,
        snapshot: &snapshot,
        failure: None,
    };
    let text = report.model().text();
    let row = text
        .lines()
        .find(|l| l.starts_with("web/web-02"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(row.contains("ready 50% (web/web-02)"), "{text}");
    assert!(row.contains("another key decides first"), "{text}");
    let tpl = text
        .lines()
        .find(|l| l.starts_with("web/web-tpl1"))
        .unwrap();
    assert!(tpl.contains("maint 100% (zone-b)"), "{text}");
    // Without it: the row keys in service are listed.
    let target = Target::group("zone-b");
    let report = Report {
        target: &target,
        ..report
    };
    let text = report.model().text();
    assert!(
        text.contains("1 row key is in service: web/web-02 = 50%. A server of zone-b"),
        "{text}"
    );
    assert_eq!(
        serde_json::to_value(report.model()).unwrap()["row_keys_deciding_first"],
        json!([{"key": "web/web-02", "value": "50%"}])
    );
    // After an undrain, the row keys that keep servers out.
    let plan = plan_undrain(
        currents("p/", &pairs, &target.keys),
        Duration::ZERO,
        &RampArgs::default(),
    )
    .unwrap();
    let report = Report {
        plan: &plan,
        ..report
    };
    assert!(
        report
            .model()
            .text()
            .contains("1 row key is at drain, maint or 0%: web/web-09 = maint. A server of zone-b whose row key is one of them stays out."),
        "{}",
        report.model().text()
    );
}
