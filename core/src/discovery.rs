//! Fallback addresses found from Consul itself, when no
//! `--consul-fallback-addr` list is given: the servers of our datacenter,
//! from the raft peers (`GET /v1/status/peers?stale`, a list of `ip:port`
//! server RPC addresses; Consul 1.8.7 `agent/consul/status_endpoint.go`,
//! answered by any server from its raft configuration, no ACL needed), each
//! on the scheme of `--consul-addr` and on `--consul-fallback-port`, else
//! `--consul-addr`'s port (Consul does not publish a server's HTTP port).
//!
//! Which addresses a peer list gives, how a new list replaces the one in
//! use (kept in order, proofs kept), and which addresses are asked for it
//! are decided here; the watcher performs the reads and keeps the time.
//! Every address found is proven the same Consul before reads go through
//! it ([`crate::route::judge`]), so a list is only a hint. Pure: no
//! I/O, no clock.

use std::net::SocketAddr;
use std::time::Duration;

/// How often the list is read again: 30 s, the default of
/// `--consul-fallback-refresh`.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(30);

/// After a read that failed (or a probe that found no fallback fresh), the
/// list is read again this soon, not sooner: 5 s.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The allowed `--consul-fallback-refresh` (inclusive): 1 s to 10 min.
pub const REFRESH_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(600));

/// Most addresses a list may give: 64 (a Consul datacenter runs 3 or 5
/// servers; raft's own guidance stops at 7). Past it the rest are dropped
/// and counted as bad entries.
pub const MAX_FOUND: usize = 64;

/// How the addresses found are made: `scheme://<peer ip>:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// The scheme of `--consul-addr`: `http` (or `https`).
    pub scheme: String,
    /// `--consul-fallback-port`, else the port of `--consul-addr`.
    pub port: u16,
    /// How often the list is read again (`--consul-fallback-refresh`).
    /// Default [`DEFAULT_REFRESH`].
    pub refresh: Duration,
}

/// The fallback addresses a peer list gives.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Found {
    /// `scheme://ip:port` for each peer, sorted, each once, without
    /// `primary`.
    pub addrs: Vec<String>,
    /// Entries that are not `ip:port` (or past [`MAX_FOUND`]), as given.
    pub bad: Vec<String>,
}

/// The addresses `peers` (`/v1/status/peers` entries, e.g.
/// `10.0.0.11:8300` or `[2001:db8::11]:8300`) give, on `discovery`'s
/// scheme and port, without `primary` (`--consul-addr`, normalized as the
/// configuration keeps it). An entry that is not an IP and a port is
/// returned in [`Found::bad`]; raft names servers by their advertise
/// address, always an IP.
pub fn addresses(peers: &[String], discovery: &Discovery, primary: &str) -> Found {
    let mut found = Found::default();
    for peer in peers {
        let Ok(sock) = peer.trim().parse::<SocketAddr>() else {
            found.bad.push(peer.clone());
            continue;
        };
        let host = match sock {
            SocketAddr::V4(v4) => v4.ip().to_string(),
            SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
        };
        let addr = format!("{}://{host}:{}", discovery.scheme, discovery.port);
        if addr != primary && !found.addrs.contains(&addr) {
            found.addrs.push(addr);
        }
    }
    found.addrs.sort();
    if found.addrs.len() > MAX_FOUND {
        found.bad.extend(found.addrs.split_off(MAX_FOUND));
    }
    found
}

/// A new list of fallbacks to use, from [`update`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refit {
    /// The fallbacks, in order: those kept in the order they had, then the
    /// new ones.
    pub list: Vec<String>,
    /// For each address of the new route list (0: the primary, then
    /// `list`), the index it had in the old one (0: the primary, 1.. the
    /// old fallbacks), `None` for an address new to the list: what
    /// [`crate::route::Routes::refit`] takes.
    pub keep: Vec<Option<usize>>,
    /// Addresses new to the list.
    pub added: Vec<String>,
    /// Addresses no longer in it.
    pub removed: Vec<String>,
}

/// How `found` replaces the fallbacks in use, `current`: `None` when it
/// changes nothing, or when it is empty (a datacenter's servers do not all
/// leave at once: an empty answer, or one naming only `--consul-addr`,
/// keeps the list in use rather than drop every fallback).
pub fn update(current: &[String], found: &[String]) -> Option<Refit> {
    if found.is_empty() {
        return None;
    }
    let kept: Vec<usize> = (0..current.len())
        .filter(|i| found.contains(&current[*i]))
        .collect();
    let added: Vec<String> = found
        .iter()
        .filter(|a| !current.contains(a))
        .cloned()
        .collect();
    if kept.len() == current.len() && added.is_empty() {
        return None;
    }
    let removed = current
        .iter()
        .filter(|a| !found.contains(a))
        .cloned()
        .collect();
    let mut list: Vec<String> = kept.iter().map(|i| current[*i].clone()).collect();
    list.extend(added.iter().cloned());
    let keep = std::iter::once(Some(0))
        .chain(kept.iter().map(|i| Some(i + 1)))
        .chain(added.iter().map(|_| None))
        .collect();
    Some(Refit {
        list,
        keep,
        added,
        removed,
    })
}

/// The addresses to ask for the list, in order (indexes into the route
/// list, 0 the primary): the one reads go through now, then the primary,
/// then every other address `usable` says reads may go through (a proven
/// fallback). An address not proven is never asked: a Consul of another
/// datacenter would hand over its own servers.
pub fn sources(current: usize, count: usize, usable: impl Fn(usize) -> bool) -> Vec<usize> {
    let mut out = vec![current];
    if current != 0 {
        out.push(0);
    }
    out.extend((1..count).filter(|r| *r != current && usable(*r)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(port: u16) -> Discovery {
        Discovery {
            scheme: "http".into(),
            port,
            refresh: DEFAULT_REFRESH,
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// The peer list's table: what each answer gives.
    #[test]
    fn peers_give_the_servers_on_the_primary_scheme_and_port() {
        type Case = (
            &'static [&'static str],
            Discovery,
            &'static str,
            &'static [&'static str],
            &'static [&'static str],
        );
        let cases: Vec<Case> = vec![
            (
                &["10.0.0.13:8300", "10.0.0.11:8300", "10.0.0.12:8300"],
                http(8500),
                "http://127.0.0.1:8500",
                &[
                    "http://10.0.0.11:8500",
                    "http://10.0.0.12:8500",
                    "http://10.0.0.13:8500",
                ],
                &[],
            ),
            // The primary is a server itself: not its own fallback.
            (
                &["10.0.0.11:8300", "10.0.0.12:8300"],
                http(8500),
                "http://10.0.0.11:8500",
                &["http://10.0.0.12:8500"],
                &[],
            ),
            // --consul-fallback-port, and the scheme of --consul-addr.
            (
                &["10.0.0.11:8300"],
                Discovery {
                    scheme: "https".into(),
                    ..http(8501)
                },
                "https://127.0.0.1:8501",
                &["https://10.0.0.11:8501"],
                &[],
            ),
            (
                &["[2001:db8::11]:8300", "2001:db8::12"],
                http(8500),
                "http://[::1]:8500",
                &["http://[2001:db8::11]:8500"],
                &["2001:db8::12"],
            ),
            // Names and garbage are bad entries, counted, never used; a
            // server named twice is one address.
            (
                &["consul-1:8300", "", "10.0.0.11:8300", "10.0.0.11:8301"],
                http(8500),
                "http://127.0.0.1:8500",
                &["http://10.0.0.11:8500"],
                &["consul-1:8300", ""],
            ),
            (&[], http(8500), "http://127.0.0.1:8500", &[], &[]),
        ];
        for (peers, discovery, primary, addrs, bad) in cases {
            let found = addresses(&strings(peers), &discovery, primary);
            assert_eq!(found.addrs, strings(addrs), "{peers:?}");
            assert_eq!(found.bad, strings(bad), "{peers:?}");
        }
    }

    #[test]
    fn a_list_past_the_most_keeps_the_first_and_names_the_rest_bad() {
        let peers: Vec<String> = (0..70).map(|i| format!("10.0.1.{i}:8300")).collect();
        let found = addresses(&peers, &http(8500), "http://127.0.0.1:8500");
        assert_eq!(found.addrs.len(), MAX_FOUND);
        assert_eq!(found.bad.len(), 70 - MAX_FOUND);
    }

    #[test]
    fn a_new_list_keeps_the_survivors_in_order_and_appends_the_new() {
        let current = strings(&["http://a:1", "http://b:1", "http://c:1"]);
        let refit = update(
            &current,
            &strings(&["http://a:1", "http://c:1", "http://d:1"]),
        )
        .expect("a change");
        assert_eq!(
            refit.list,
            strings(&["http://a:1", "http://c:1", "http://d:1"])
        );
        assert_eq!(refit.keep, vec![Some(0), Some(1), Some(3), None]);
        assert_eq!(refit.added, strings(&["http://d:1"]));
        assert_eq!(refit.removed, strings(&["http://b:1"]));
        // From nothing, at start-up.
        let first = update(&[], &strings(&["http://a:1"])).expect("a change");
        assert_eq!(first.keep, vec![Some(0), None]);
    }

    #[test]
    fn the_same_list_or_an_empty_one_changes_nothing() {
        let current = strings(&["http://a:1", "http://b:1"]);
        assert_eq!(
            update(&current, &strings(&["http://b:1", "http://a:1"])),
            None
        );
        assert_eq!(
            update(&current, &[]),
            None,
            "an empty answer keeps the list"
        );
        assert_eq!(update(&[], &[]), None);
    }

    #[test]
    fn the_list_is_asked_of_the_address_in_use_then_the_primary_then_the_proven() {
        let proven = |r: usize| r == 2 || r == 3;
        assert_eq!(sources(0, 4, proven), vec![0, 2, 3]);
        assert_eq!(sources(3, 4, proven), vec![3, 0, 2]);
        assert_eq!(sources(0, 1, proven), vec![0]);
        assert_eq!(
            sources(0, 4, |_| false),
            vec![0],
            "the unproven are never asked"
        );
    }
}
