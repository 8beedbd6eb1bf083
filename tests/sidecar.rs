//! The agent as a Kubernetes sidecar: `--on-startup-timeout retry` keeps it
//! up and unready while Consul is away at start, answering nobody, until
//! the first sync. (The VM default, exit 1, is in tests/consul.rs.)

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::{wait_for, Agent, Consul};

/// What an agent-check connection gets back within 1 s (empty: nothing).
fn ask(agent: &Agent, line: &str) -> String {
    let mut s = TcpStream::connect(agent.listen).expect("responder listening");
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    s.write_all(line.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn retry_stays_up_unready_and_answers_nobody_until_consul_comes() {
    let consul_port = support::free_port();
    let url = format!("http://127.0.0.1:{consul_port}");
    let mut agent = Agent::spawn(
        &url,
        &["--startup-timeout", "1s", "--on-startup-timeout", "retry"],
    );

    // Three times the startup timeout: still running, still not ready.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        agent.proc().try_wait().is_none(),
        "the agent exited without Consul:\n{}",
        agent.log()
    );
    let (status, body) = agent.http_get("/-/ready").expect("HTTP answers");
    assert_eq!(status, 503, "{body}");
    assert_eq!(agent.http_get("/-/healthy").expect("HTTP answers").0, 200);
    assert_eq!(ask(&agent, "web/web-01 canary\n"), "");
    assert!(agent.log().contains("staying up"), "{}", agent.log());

    // Consul comes up where the agent looks: ready at the first sync
    // (backoff after 3 s of failures is at most 2 s), answering from KV.
    let consul = Consul::start_on(consul_port, &[]);
    consul.put("canary", "drain");
    agent.wait_ready_within(Duration::from_secs(15));
    let answered = wait_for(Duration::from_secs(5), || {
        let a = ask(&agent, "web/web-01 canary\n");
        (a == "drain 100%\n").then_some(a)
    });
    assert!(answered.is_some(), "{}", agent.log());
    assert!(agent.proc().try_wait().is_none());
}
