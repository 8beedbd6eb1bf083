//! Long `--help` texts that are not one option's.

/// Exit statuses of `state`, shown in `--help` (sysexits.h).
pub const EXIT_CODES_HELP: &str = "\
Exit status:
  0    done, or nothing to do (`explain`: also when the answer is
       `unknown` for lack of the server's groups)
  64   bad options or arguments (EX_USAGE); also a --server glob or a
       whole --backend with no HAProxy configuration or stats socket to
       expand it (give --haproxy-config or --haproxy-socket)
  65   invalid key or value, a key holding an invalid value where that is
       refused, or a selection with no server to write; nothing written
       (EX_DATAERR). Also `drain --haproxy-socket` when HAProxy did not put
       a server in DRAIN (drain was written, maint was not), or not in
       MAINT after maint was written (something else decides it first).
       Also a group (--zone, --group, canary, `set` of a group key) that
       no load balancer names, by --prometheus: the groups that exist are
       listed closest first (--new-group writes it anyway)
  66   the HAProxy configuration or stats socket cannot be read (EX_NOINPUT)
  68   written, but not confirmed: with --prometheus, not every agent
       answered from the write's index within --confirm-timeout (the
       lagging agents are named; the next step is not written), servers
       naming the written group are kept in service by another key (named;
       --accept-overridden takes them), or Prometheus could not be asked.
       `status`: an agent lags (EX_NOHOST)
  69   Consul unreachable, timed out, or without a leader (EX_UNAVAILABLE)
  75   conflict: a key changed since it was read (also: a Consul session
       took or released it); it was not overwritten (EX_TEMPFAIL). A key a
       session holds when read is written with its release, named on
       stderr, so the session ending cannot delete the write
  76   Consul answered something unusable (EX_PROTOCOL)
  77   permission denied: Consul refused the token, or the token file cannot
       be read (EX_NOPERM)
  130  interrupted by SIGINT (143: SIGTERM, 129: SIGHUP, e.g. the SSH
       session dropped); what was written is reported, nothing more is
       written

Keys are relative to --prefix: `canary`, `web/web-01`. Values: ready,
drain, maint or N% (0..=256).";
