//! The configuration and `show servers state` grammars, table by table.

use super::*;

#[test]
fn static_algorithms_are_found_with_their_defaults() {
    let cfg = "defaults\n    balance source\n\n\
               backend a\n    server s 10.0.0.1:80\n\n\
               backend b\n    balance roundrobin\n\n\
               backend c\n    balance uri\n    hash-type consistent\n\n\
               backend d\n    balance hdr(host)\n\n\
               defaults named\n    balance leastconn\n\n\
               backend e\n\n\
               listen f\n    balance static-rr\n\n\
               backend g from named\n    balance first\n";
    let found = static_backends(cfg);
    let names: Vec<(&str, &str)> = found
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("a", "source"),
            ("d", "hdr(host)"),
            ("f", "static-rr"),
            ("g", "first")
        ]
    );
}
use crate::model::identity::MAX_IDENTITIES;

impl Enrolment {
    fn row_key_for_test(&self) -> Option<&str> {
        match self {
            Enrolment::Enrolled { identities } => Some(identities[0].as_str()),
            Enrolment::NotEnrolled(_) => None,
        }
    }
}

#[test]
fn tokenizes_like_haproxy() {
    assert_eq!(
        tokenize(r#"  server web-01 10.0.0.1:443 agent-send "web/web-01 zone-b\n" # c"#),
        vec![
            "server",
            "web-01",
            "10.0.0.1:443",
            "agent-send",
            "web/web-01 zone-b\n"
        ]
    );
    assert_eq!(tokenize(r"a\ b 'c d\n' e\#f"), vec!["a b", "c d\\n", "e#f"]);
    assert_eq!(tokenize(r#""\x41\"" """#), vec!["A\"", ""]);
    assert!(tokenize("   # only a comment").is_empty());
}

const CONFIG: &str = r#"
global
    stats socket /run/haproxy/admin.sock mode 600 level admin

defaults
    mode http
    default-server agent-check agent-addr 127.0.0.1 agent-port 9777 agent-inter 2s

peers lb
    server lb-01 10.0.0.9:1024

frontend https
    bind :443
    default_backend web

backend web
    server web-01 10.0.0.1:443 check weight 100 agent-send "web/web-01 zone-us-east1-b\n"
    server web-02 10.0.0.2:443 check agent-send 'web/web-02 zone-us-east1-c'
    server web-03 10.0.0.3:443 check no-agent-check agent-send "web/web-03 zone-us-east1-b\n"
    server web-04 10.0.0.4:443 check
    server web-05 10.0.0.5:443 agent-send "canary zone-us-east1-b\n"
    server web-06 10.0.0.6:443 agent-send "web/web-06 $HOME\n"

defaults
    mode tcp

listen api
    default-server agent-addr 127.0.0.1 agent-port 9777 agent-send "x\n"
    server api-01 10.0.1.1:443 agent-check agent-send "api/api-01 canary zone-us-east1-b\n"
    server api-02 10.0.1.2:443 cookie agent-check agent-send "api/api-02\n"
    server api-03 10.0.1.3:443
"#;

#[test]
fn reads_backends_defaults_and_agent_send() {
    let servers = parse_config(CONFIG);
    let by: HashMap<String, &Server> = servers.iter().map(|s| (s.id(), s)).collect();
    assert_eq!(servers.len(), 9, "{servers:#?}");
    assert!(
        !by.contains_key("lb/lb-01"),
        "peers servers are not proxies"
    );
    assert_eq!(
        by["web/web-01"].enrolment,
        Enrolment::Enrolled {
            identities: vec!["web/web-01".into(), "zone-us-east1-b".into()],
        }
    );
    assert_eq!(by["web/web-01"].groups, vec!["zone-us-east1-b"]);
    // Single quotes keep `\n` literal: no LF, the agent never answers.
    assert_eq!(
        by["web/web-02"].enrolment,
        Enrolment::NotEnrolled(
            "agent-send does not end with \\n: the agent never answers it".into()
        )
    );
    assert_eq!(by["web/web-02"].groups, vec!["zone-us-east1-c"]);
    assert_eq!(
        by["web/web-03"].enrolment,
        Enrolment::NotEnrolled("no agent-check".into())
    );
    assert_eq!(by["web/web-03"].groups, vec!["zone-us-east1-b"]);
    assert_eq!(
        by["web/web-04"].enrolment,
        Enrolment::NotEnrolled("agent-check without agent-send".into())
    );
    // Enrolled through its groups, with no row key of its own.
    assert_eq!(
        by["web/web-05"].identities(),
        ["canary".to_string(), "zone-us-east1-b".to_string()]
    );
    assert_eq!(by["web/web-05"].row_key(), None);
    assert!(by["web/web-05"]
        .no_row_key()
        .contains("starts with the group `canary`"));
    assert!(matches!(
        &by["web/web-06"].enrolment,
        Enrolment::NotEnrolled(r) if r.contains("refuses")
    ));
    // The second, plain defaults section has no default-server.
    assert_eq!(by["api/api-01"].row_key(), Some("api/api-01"));
    assert_eq!(by["api/api-01"].groups, vec!["canary", "zone-us-east1-b"]);
    // `cookie` takes a value: the `agent-check` after it is the cookie.
    assert_eq!(
        by["api/api-02"].enrolment,
        Enrolment::NotEnrolled("no agent-check".into())
    );
    assert_eq!(
        by["api/api-03"].enrolment,
        Enrolment::NotEnrolled("no agent-check".into())
    );
}

/// The enrolment of one server with agent-check and this agent-send
/// argument (as written in the configuration, in double quotes).
fn enrolment_of(send: &str) -> Enrolment {
    let servers = parse_config(&format!(
        "backend b\n  server s 1.2.3.4:80 agent-check agent-send \"{send}\"\n"
    ));
    servers[0].enrolment.clone()
}

fn reason(send: &str) -> String {
    match enrolment_of(send) {
        Enrolment::NotEnrolled(why) => why,
        e => panic!("{send:?} is enrolled: {e:?}"),
    }
}

#[test]
fn enrolled_only_when_the_agent_answers_the_line() {
    assert_eq!(
        enrolment_of(r"web/web-01 canary zone-b\n"),
        Enrolment::Enrolled {
            identities: vec!["web/web-01".into(), "canary".into(), "zone-b".into()],
        }
    );
    // CRLF is accepted, as by the agent.
    assert_eq!(
        enrolment_of(r"web/web-01\r\n").row_key_for_test(),
        Some("web/web-01")
    );
    assert!(reason("web/web-01 zone-b").contains("does not end with \\n"));
    // A line that starts with a group is answered too (from the group).
    assert_eq!(
        enrolment_of(r"canary legacy/l-02 zone-c\n").row_key_for_test(),
        Some("canary")
    );
    let many = format!("web/web-01 {}\\n", vec!["g"; MAX_IDENTITIES].join(" "));
    assert!(
        reason(&many).contains("refuses its agent-send (more than 16 identities)"),
        "{}",
        reason(&many)
    );
    let most = format!("web/web-01 {}\\n", vec!["g"; MAX_IDENTITIES - 1].join(" "));
    assert_eq!(enrolment_of(&most).row_key_for_test(), Some("web/web-01"));
    assert!(reason(r"web/web-01 $HOME\n").contains("refuses"));
    assert!(reason(r"web/web-01/x\n").contains("refuses"));
    assert!(reason(r"\n").contains("refuses"));
    // 1 KiB, LF included, as the agent reads it.
    let fits = format!("web/web-01{}g\\n", " ".repeat(MAX_LINE - 12));
    assert_eq!(enrolment_of(&fits).row_key_for_test(), Some("web/web-01"));
    let long = format!("web/web-01{}g\\n", " ".repeat(MAX_LINE - 11));
    assert!(
        reason(&long).contains("longer than 1024 bytes"),
        "{}",
        reason(&long)
    );
}

#[test]
fn zones_of_lines_the_agent_refuses_are_read_too() {
    let servers = parse_config(
        "backend b\n  server s 1.2.3.4:80 agent-check agent-send \"b/s zone-z $HOME\\n\"\n",
    );
    assert!(servers[0].groups.contains(&"zone-z".to_string()));
    assert_eq!(servers[0].row_key(), None);
}

#[test]
fn server_templates_declare_numbered_servers_without_row_keys() {
    let servers = parse_config(
        "defaults\n  default-server agent-check\nbackend web\n  server web-01 1.1.1.1:80 agent-send \"web/web-01 zone-b\\n\"\n  server-template web-tpl 3 web.service.consul:8181 check agent-send \"zone-b\\n\"\n  server-template r 5-6 r.service.consul agent-send \"web/r zone-c\\n\"\n  server-template bad 0 x.consul agent-send \"zone-b\\n\"\n  server-template huge 20000 x.consul agent-send \"zone-b\\n\"\n",
    );
    let ids: Vec<String> = servers.iter().map(Server::id).collect();
    assert_eq!(
        ids,
        [
            "web/web-01",
            "web/web-tpl1",
            "web/web-tpl2",
            "web/web-tpl3",
            "web/r5",
            "web/r6"
        ]
    );
    for s in &servers[1..] {
        assert!(s.template, "{s:?}");
        assert_eq!(s.row_key(), None, "one line for all: no row key of its own");
        assert!(matches!(s.enrolment, Enrolment::Enrolled { .. }), "{s:?}");
    }
    assert_eq!(servers[1].groups, ["zone-b"]);
    assert!(servers[1].no_row_key().starts_with("server-template"));
    assert_eq!(template_numbers("3"), 1..=3);
    assert_eq!(template_numbers("5-7"), 5..=7);
    for bad in ["0", "x", "7-5", "-3", "1-", "0-2"] {
        assert!(template_numbers(bad).is_empty(), "{bad}");
    }
}

#[test]
fn named_defaults_and_from() {
    let servers = parse_config(
        "defaults agents\n  default-server agent-check\ndefaults plain\nbackend b from agents\n  server s 1.2.3.4:80 agent-send \"b/s\\n\"\nbackend c\n  server s 1.2.3.4:80 agent-send \"c/s\\n\"\n",
    );
    assert_eq!(servers[0].row_key(), Some("b/s"));
    assert_eq!(servers[1].row_key(), None);
}

#[test]
fn reads_show_servers_state() {
    let out = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n2 web 1 a 127.0.0.1 2 0 100 100 1 1 0 2 0 22 0 0 - 1 - 0 0 - 127.0.0.1 18777\n2 web 2 b 127.0.0.1 2 0 100 100 1 1 0 2 0 0 0 0 - 1 - 0 0 - 127.0.0.1 18777\n\n";
    let servers = parse_servers_state(out).unwrap();
    assert_eq!(servers[0].row_key(), Some("web/a"));
    assert_eq!(servers[1].row_key(), None);
    assert!(parse_servers_state("Unknown command\n").is_err());
    let states =
        parse_admin_states(&out.replace(" 2 0 100 100 1 1 0 2 0 0 ", " 2 8 100 100 1 1 0 2 0 0 "))
            .unwrap();
    assert_eq!(states["web/a"], 0);
    assert_eq!(states["web/b"], ADMIN_FORCED_DRAIN);
    assert!(parse_admin_states("Unknown command\n").is_err());
}

#[test]
fn globs() {
    for (p, t, want) in [
        ("web-0[12]-sv-gprd", "web-01-sv-gprd", true),
        ("web-0[12]-sv-gprd", "web-03-sv-gprd", false),
        ("web-*", "web-01", true),
        ("web-*", "api-01", false),
        ("*", "", true),
        ("a*b*c", "axxbyyc", true),
        ("a*b*c", "axxbyy", false),
        ("web-0?", "web-01", true),
        ("web-0?", "web-1", false),
        ("web-[!1]*", "web-2x", true),
        ("web-[^1]*", "web-1x", false),
        ("web-[0-9][0-9]", "web-42", true),
        ("web-[", "web-[", true),
        ("web-[*", "web-[01", true),
        ("web-[*", "web-01", false),
        ("web-**", "web-01", true),
        ("***", "x", true),
        ("exact", "exact", true),
        ("exact", "exactly", false),
    ] {
        assert_eq!(glob_match(p, t), want, "{p} vs {t}");
    }
}
