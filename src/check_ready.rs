//! `gitlab-haproxy-agent check-ready`: whether the local agent answers
//! with desired state (`/-/answering` on its HTTP port: from Consul, or from
//! its state file) and answers on its agent-check port (one line). HAProxy's reload runs it first (the cookbook's systemd drop-in):
//! a reload starts every server READY, and only an answering agent puts the
//! drained ones back.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use crate::cli::{AgentArgs, CheckReadyArgs};

/// Exit status when the agent is not ready or not answering (EX_UNAVAILABLE).
pub const NOT_READY: u8 = 69;

/// The identity the probe line names. It is no server and no group: the
/// agent answers it without remembering it as a row (so it never holds
/// `answered_index` back, names no group and shows on no `/status`), and
/// the writer refuses it as a group key.
pub const PROBE_IDENTITY: &str = "check-ready";

/// Why the writer refuses [`PROBE_IDENTITY`] as a group key.
pub const NOT_A_GROUP: &str = "check-ready is the line the reload guard (`gitlab-haproxy-agent \
     check-ready`) sends to the agent, not a group: no server names it, and a key check-ready \
     would only change what the guard is answered; nothing written (a key check-ready written \
     earlier goes with `state clear check-ready`)";

/// The agent-send line asked: [`PROBE_IDENTITY`] and a LF.
pub const PROBE_LINE: &[u8] = b"check-ready\n";

/// How `/-/answering`'s 200 begins while the agent answers from its state
/// file, before any Consul answer.
pub const FROM_STATE_FILE: &str = "answering from the state file";

/// What the check found.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Answering: how (from Consul or the state file) and the reply to the
    /// probe line.
    Ready(String),
    /// Not ready or not answering (why), but an override file is in force.
    Overridden(String),
    /// Not ready or not answering: why.
    NotReady(String),
}

/// Runs the check and prints what it found (stderr for refusals and
/// overrides, so that the reload's journal shows them).
pub fn main(agent: &AgentArgs, args: &CheckReadyArgs) -> ExitCode {
    let agent_addr = loopback_if_unspecified(args.agent_addr.unwrap_or(agent.listen));
    let http_addr = loopback_if_unspecified(args.http_addr.unwrap_or(agent.http_listen));
    match check(agent_addr, http_addr, args) {
        Outcome::Ready(reply) => {
            println!("check-ready: the agent on {agent_addr} is {reply}");
            ExitCode::SUCCESS
        }
        Outcome::Overridden(why) => {
            eprintln!(
                "check-ready: WARNING: {why}; allowed anyway because the override file {} is \
                 present: servers drained or in maint will be READY after a HAProxy reload until \
                 the agent answers. Remove the file once done.",
                args.override_file.display()
            );
            ExitCode::SUCCESS
        }
        Outcome::NotReady(why) => {
            eprintln!(
                "check-ready: refused: {why}. A HAProxy reload now would put every drained or \
                 maint server back in service until the agent answers. Bring the agent back \
                 (systemctl status gitlab-haproxy-agent; runbook \"Agent down\"), or, if the \
                 agent itself is what is broken and HAProxy must reload, `touch {}` (honoured \
                 for {}) and reload again.",
                args.override_file.display(),
                humantime::format_duration(args.override_max_age)
            );
            ExitCode::from(NOT_READY)
        }
    }
}

/// Asks the agent, then looks at the override file when the agent fails.
pub fn check(agent_addr: SocketAddr, http_addr: SocketAddr, args: &CheckReadyArgs) -> Outcome {
    let why = match answering(http_addr, args.timeout)
        .and_then(|how| Ok((answer(agent_addr, args.timeout)?, how)))
    {
        Ok((Some(reply), how)) => return Outcome::Ready(format!("{how}; {reply:?}")),
        // From the state file a `ready` is not answered: the port
        // read the line and withheld its ready, as it should.
        Ok((None, how)) if how.starts_with(FROM_STATE_FILE) => {
            return Outcome::Ready(format!(
            "{how}; the agent-check port read the line and withheld its ready until Consul answers"
        ))
        }
        Ok((None, _)) => format!(
            "the agent-check port {} closed without an answer",
            loopback_if_unspecified(agent_addr)
        ),
        Err(why) => why,
    };
    match override_age(&args.override_file) {
        Some(age) if age <= args.override_max_age => Outcome::Overridden(why),
        Some(Duration::MAX) => Outcome::NotReady(format!(
            "{why} (the override file {} is dated in the future: ignored; touch it again)",
            args.override_file.display(),
        )),
        Some(age) => Outcome::NotReady(format!(
            "{why} (the override file {} is {} old, older than {}: ignored)",
            args.override_file.display(),
            humantime::format_duration(Duration::from_secs(age.as_secs())),
            humantime::format_duration(args.override_max_age)
        )),
        None => Outcome::NotReady(why),
    }
}

/// The age of the override file, `None` when there is none or it is not a
/// regular file. A file dated in the future has no age that can be told
/// (`touch -d` by mistake, a clock set back): it counts as older than any
/// limit, so it does not disarm the check.
fn override_age(path: &Path) -> Option<Duration> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let modified = meta.modified().ok()?;
    Some(
        SystemTime::now()
            .duration_since(modified)
            .unwrap_or(Duration::MAX),
    )
}

fn loopback_if_unspecified(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}

fn connect(addr: SocketAddr, timeout: Duration, what: &str) -> Result<TcpStream, String> {
    let stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("the agent's {what} {addr} cannot be reached ({e})"))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| format!("the agent's {what} {addr}: {e}"))?;
    Ok(stream)
}

/// Reads at most `max` bytes until the peer closes, or up to and including
/// the first LF when `line`.
fn read_bounded(stream: &mut TcpStream, max: usize, line: bool) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    while out.len() < max {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if line && out.contains(&b'\n') {
            break;
        }
    }
    Ok(out)
}

/// The agent answers with desired state: `GET /-/answering` answers 200
/// (from Consul, or from its state file while Consul has not answered since
/// the start: what it serves through an outage either way). An agent too
/// old to know `/-/answering` (404, during an upgrade) is asked `/-/ready`.
/// Returns the answer's first line.
fn answering(addr: SocketAddr, timeout: Duration) -> Result<String, String> {
    match get(addr, "/-/answering", timeout)? {
        (404, _) => match get(addr, "/-/ready", timeout)? {
            (200, body) => Ok(body),
            (code, body) => Err(format!(
                "the agent is not ready (http://{addr}/-/ready answered {code}: {body})"
            )),
        },
        (200, body) => Ok(body),
        (code, body) => Err(format!(
            "the agent is not answering (http://{addr}/-/answering answered {code}: {body})"
        )),
    }
}

/// `GET path`: the status and the first line of the body.
fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, String), String> {
    let url = format!("http://{addr}{path}");
    let mut stream = connect(addr, timeout, "HTTP port")?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .map_err(|e| format!("{url}: {e}"))?;
    let raw = read_bounded(&mut stream, 4096, false)
        .map_err(|e| format!("{url}: {}", read_error(&e, timeout)))?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("{url} gave no HTTP answer"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.trim())
        .unwrap_or("")
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    Ok((status, body))
}

/// The agent-check port answers [`PROBE_LINE`] with a line; `None` when it
/// read the line and closed without one.
fn answer(addr: SocketAddr, timeout: Duration) -> Result<Option<String>, String> {
    let mut stream = connect(addr, timeout, "agent-check port")?;
    stream
        .write_all(PROBE_LINE)
        .map_err(|e| format!("the agent-check port {addr}: {e}"))?;
    let raw = read_bounded(&mut stream, 1024, true).map_err(|e| {
        format!(
            "the agent-check port {addr} did not answer ({})",
            read_error(&e, timeout)
        )
    })?;
    let text = String::from_utf8_lossy(&raw);
    Ok(text
        .split_once('\n')
        .map(|(line, _)| line.trim_end_matches('\r').to_string()))
}

/// A read error in words: a timeout (`EAGAIN` on a socket with a read
/// timeout) says how long was waited.
fn read_error(e: &std::io::Error, timeout: Duration) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("no answer within {}", humantime::format_duration(timeout))
        }
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_addresses_are_asked_on_loopback() {
        let a: SocketAddr = "0.0.0.0:9777".parse().unwrap();
        assert_eq!(
            loopback_if_unspecified(a),
            "127.0.0.1:9777".parse().unwrap()
        );
        let a: SocketAddr = "[::]:9777".parse().unwrap();
        assert_eq!(loopback_if_unspecified(a), "[::1]:9777".parse().unwrap());
        let a: SocketAddr = "127.0.0.2:9777".parse().unwrap();
        assert_eq!(loopback_if_unspecified(a), a);
    }

    #[test]
    fn only_a_regular_file_dated_in_the_past_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("allow");
        assert_eq!(override_age(&file), None, "no file");
        std::fs::create_dir(&file).unwrap();
        assert_eq!(override_age(&file), None, "a folder is not an override");
        std::fs::remove_dir(&file).unwrap();
        let f = std::fs::File::create(&file).unwrap();
        assert!(override_age(&file).unwrap() < Duration::from_secs(60));
        let future = SystemTime::now() + Duration::from_secs(10 * 86_400);
        f.set_modified(future).unwrap();
        assert_eq!(
            override_age(&file),
            Some(Duration::MAX),
            "dated in the future"
        );
        let past = SystemTime::now() - Duration::from_secs(7_200);
        f.set_modified(past).unwrap();
        let age = override_age(&file).unwrap();
        assert!(age >= Duration::from_secs(7_199) && age < Duration::from_secs(7_300));
    }

    #[test]
    fn a_read_timeout_says_how_long_was_waited() {
        let e = std::io::Error::from(std::io::ErrorKind::WouldBlock);
        assert_eq!(
            read_error(&e, Duration::from_secs(2)),
            "no answer within 2s"
        );
    }
}
