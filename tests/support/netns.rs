//! A private network and PID namespace for tests that cut network links:
//! the test (or benchmark) binary runs itself again under `unshare --net
//! --pid --fork --kill-child --mount-proc`, so Consul, HAProxy, the agents
//! and the nftables rules that partition them all live in a namespace that
//! has only its own loopback, and die with it.
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set in the environment of the run inside the namespace.
pub const INSIDE: &str = "GITLAB_HAPROXY_AGENT_TEST_NETNS";

/// Whether this process runs inside the private namespace.
pub fn inside() -> bool {
    std::env::var_os(INSIDE).is_some()
}

/// Inside the namespace: brings `lo` up and returns true; the caller goes
/// on with the test. Outside: runs this binary again with `args` inside a
/// new namespace (stdout and stderr shared), waits up to `timeout` (then
/// kills `unshare` by its PID, which kills every process in the
/// namespace), panics unless that run exited 0, and returns false: the
/// caller returns.
pub fn enter(args: &[&str], timeout: Duration) -> bool {
    if inside() {
        let up = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("run ip (iproute2)");
        assert!(up.success(), "ip link set lo up failed");
        return true;
    }
    for tool in ["unshare", "nft", "setpriv", "ip"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            found,
            "{tool} not found: run scripts/install-deps.sh as root (nftables, util-linux, iproute2)"
        );
    }
    let exe = std::env::current_exe().expect("current executable");
    let mut child = Command::new("unshare")
        .args(["--net", "--pid", "--fork", "--kill-child", "--mount-proc"])
        .arg(&exe)
        .args(args)
        .env(INSIDE, "1")
        .stdin(Stdio::null())
        .spawn()
        .expect("run unshare (as root)");
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for unshare") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    match status {
        Some(s) if s.success() => false,
        Some(s) => panic!("the run inside the private namespace failed: {s}"),
        None => panic!("the run inside the private namespace took over {timeout:?}: killed"),
    }
}
