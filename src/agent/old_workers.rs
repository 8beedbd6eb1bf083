//! HAProxy's old workers on this node, for `state drain --until-idle`:
//! after a reload (`kill -USR2` to the master, `systemctl reload`) the
//! workers it replaced keep the sessions they hold, until those close or
//! `hard-stop-after`, and HAProxy's exporter (the new worker's) does not
//! count them. The agent counts them from `/proc` and exports
//! `gitlab_haproxy_agent_haproxy_old_workers`, so the writer can wait for
//! them; no HAProxy socket is needed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use prometheus::IntGauge;
use tokio_util::sync::CancellationToken;

/// How often `/proc` is read: 1 s, so the writer sees an old worker go
/// within a scrape interval of it exiting.
pub const POLL: Duration = Duration::from_secs(1);

/// One process as `/proc/PID/stat` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// Its PID.
    pub pid: u32,
    /// Its parent's PID.
    pub ppid: u32,
    /// `comm`, the executable's name (at most 15 bytes).
    pub comm: String,
    /// Start time in clock ticks since boot.
    pub start: u64,
}

/// Parses `/proc/PID/stat` (proc(5)): `pid (comm) state ppid ...`, field
/// 22 the start time. `None` for anything else. `comm` may hold spaces and
/// parentheses: it ends at the last `)`.
pub fn parse_stat(text: &str) -> Option<Process> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state): field N is rest[N - 3].
    Some(Process {
        pid,
        ppid: rest.get(1)?.parse().ok()?,
        comm,
        start: rest.get(19)?.parse().ok()?,
    })
}

/// The master's old workers among `processes`: its `haproxy` children but
/// the one started last (the current worker; on a reload the master forks
/// the new worker after the old ones). A `program` section's children have
/// another name and are not counted.
pub fn old_workers(master: u32, processes: &[Process]) -> Vec<u32> {
    let mut workers: Vec<&Process> = (processes.iter())
        .filter(|p| p.ppid == master && p.comm == "haproxy")
        .collect();
    workers.sort_by_key(|p| (p.start, p.pid));
    workers.pop();
    workers.iter().map(|p| p.pid).collect()
}

/// Every process `/proc` shows (those that exit meanwhile are skipped).
fn processes(proc: &Path) -> std::io::Result<Vec<Process>> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(proc)? {
        let name = entry?.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if let Ok(text) = std::fs::read_to_string(proc.join(pid).join("stat")) {
            all.extend(parse_stat(&text));
        }
    }
    Ok(all)
}

/// The number of old workers of the master whose PID `pid_file` holds;
/// `None` when that cannot be told: no file, no such master running (or
/// hidden from the agent: systemd's `ProtectProc=invisible`, another PID
/// namespace), or not a `haproxy` process.
pub fn count(pid_file: &Path, proc: &Path) -> Option<usize> {
    let master: u32 = std::fs::read_to_string(pid_file)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let all = processes(proc).ok()?;
    all.iter()
        .any(|p| p.pid == master && p.comm == "haproxy")
        .then(|| old_workers(master, &all).len())
}

/// Sets `gauge` to the count of old workers every [`POLL`], -1 when it
/// cannot be told, until `shutdown`.
pub async fn watch(pid_file: PathBuf, gauge: IntGauge, shutdown: CancellationToken) {
    loop {
        let file = pid_file.clone();
        let n = tokio::task::spawn_blocking(move || count(&file, Path::new("/proc")))
            .await
            .ok()
            .flatten();
        gauge.set(n.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX)));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, comm: &str, ppid: u32, start: u64) -> String {
        format!(
            "{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 {start} \
             12345 678 18446744073709551615 1 1 0 0 0 0 0 4096 1 0 0 0 17 1 0 0 0 0 0"
        )
    }

    #[test]
    fn stat_lines_parse_with_odd_names_and_anything_else_is_none() {
        let p = parse_stat(&stat(42, "haproxy", 7, 991)).unwrap();
        assert_eq!(
            (p.pid, p.ppid, p.comm.as_str(), p.start),
            (42, 7, "haproxy", 991)
        );
        let odd = parse_stat(&stat(5, "a) (b", 1, 3)).unwrap();
        assert_eq!((odd.comm.as_str(), odd.ppid, odd.start), ("a) (b", 1, 3));
        for bad in [
            "",
            "42",
            "42 (haproxy",
            "x (haproxy) S 1",
            "42 (haproxy) S 1 2 3",
        ] {
            assert_eq!(parse_stat(bad), None, "{bad}");
        }
    }

    #[test]
    fn old_workers_are_the_masters_haproxy_children_but_the_newest() {
        let p = |pid, ppid, comm: &str, start| parse_stat(&stat(pid, comm, ppid, start)).unwrap();
        let all = [
            p(100, 1, "haproxy", 10),
            p(101, 100, "haproxy", 11),
            p(250, 100, "haproxy", 50),
            p(180, 100, "haproxy", 40),
            p(190, 100, "my-program", 45),
            p(300, 1, "haproxy", 60),
            p(301, 300, "haproxy", 61),
        ];
        assert_eq!(old_workers(100, &all), [101, 180]);
        assert_eq!(old_workers(300, &all), Vec::<u32>::new());
        assert_eq!(old_workers(999, &all), Vec::<u32>::new());
    }

    #[test]
    fn count_is_none_without_a_pid_file_or_a_haproxy_master() {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        for (pid, text) in [
            (100, stat(100, "haproxy", 1, 10)),
            (101, stat(101, "haproxy", 100, 11)),
            (102, stat(102, "haproxy", 100, 12)),
            (7, stat(7, "sleep", 1, 1)),
        ] {
            std::fs::create_dir_all(proc.join(pid.to_string())).unwrap();
            std::fs::write(proc.join(pid.to_string()).join("stat"), text).unwrap();
        }
        let pid_file = dir.path().join("haproxy.pid");
        assert_eq!(count(&pid_file, &proc), None);
        std::fs::write(&pid_file, "100\n").unwrap();
        assert_eq!(count(&pid_file, &proc), Some(1));
        std::fs::write(&pid_file, "7\n").unwrap();
        assert_eq!(count(&pid_file, &proc), None);
        std::fs::write(&pid_file, "nonsense\n").unwrap();
        assert_eq!(count(&pid_file, &proc), None);
    }
}
