//! The `state` commands: dispatch from the parsed options, the writer's
//! token choice, and the single-key commands (`get`, `list`, `set`,
//! `clear`) and `explain`; the sequences run in [`super::execute`].

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::confirm;
use super::confirm::Unconfirmed;
use super::error::{check_key, exit, refused_invalid, report_failure, Failure};
use super::haproxy;
use super::live;
use super::output::{err_line, table};
use super::plan::{is_row_key, plan_drain, plan_undrain, plan_write, Change, Current, WaitFor};
use super::progress::{Run, StepStatus, Stop};
use super::report::{display_value, key_table, KeyReport, KeyView};
use super::select::{config_path, Target, CANARY_KEY};
use super::session::Writer;
use crate::cli::{CanaryAction, IdleArgs, Selector, StateArgs, StateCommand};
use crate::consul::config::{ConsulConfig, Fallbacks};
use crate::consul::{ConsulError, KvPair, TokenSource};
use crate::model::identity::parse_line;
use crate::model::meta::Records;
use crate::model::snapshot::{build_snapshot, Answer, Entry};
use crate::model::value::parse_value;

/// The writer's token: `--consul-token-file` (or its environment variable,
/// or the systemd credential), else `$CONSUL_HTTP_TOKEN_FILE`, else
/// `$CONSUL_HTTP_TOKEN`, as on a console node where `consul kv` works.
pub(super) fn token_source(
    config: &ConsulConfig,
    fallbacks: &Fallbacks,
) -> Result<TokenSource, ConsulError> {
    if let Some(path) = config
        .token_file
        .clone()
        .or_else(|| fallbacks.consul_http_token_file.clone())
    {
        return Ok(TokenSource::new(Some(path)));
    }
    match &fallbacks.consul_http_token {
        Some(token) => TokenSource::from_value(token, "$CONSUL_HTTP_TOKEN"),
        None => Ok(TokenSource::new(None)),
    }
}

pub(super) async fn run(config: ConsulConfig, args: &StateArgs, fallbacks: &Fallbacks) -> u8 {
    if let Err(message) = super::waits::check(args) {
        return report_failure(args.json, &Failure::usage(message));
    }
    let token = match token_source(&config, fallbacks) {
        Ok(t) => t,
        Err(e) => return report_failure(args.json, &Failure::from(e)),
    };
    let client = match config.client(token) {
        Ok(c) => c,
        Err(e) => {
            return report_failure(
                args.json,
                &Failure::new(1, "runtime", format!("cannot build the Consul client: {e}")),
            )
        }
    };
    let confirm = match confirm::of_command(args) {
        Ok(c) => c,
        Err(f) => return report_failure(args.json, &f),
    };
    let selector = match &args.command {
        StateCommand::Status(s) => Some(s.selector.as_str()),
        _ => confirm.as_ref().map(|c| c.confirm_selector.as_str()),
    };
    let holds = crate::fleet::held::Source::of(args.prometheus.as_deref(), selector);
    let author = match super::author::of(&args.command) {
        Ok(author) => author,
        Err(e) => return report_failure(args.json, &Failure::usage(e)),
    };
    let writer = Writer {
        client,
        prefix: config.prefix,
        json: args.json,
        confirm,
        holds,
        author,
    };
    if let Err(f) = writer.check_group(args).await {
        return report_failure(args.json, &f);
    }
    if let Err(f) = super::weights::check(args) {
        return report_failure(args.json, &f);
    }
    let floor = super::waits::floor(args.agent_inter, args.agent_read_delay);
    let result = match &args.command {
        StateCommand::Get { key } => writer.get(key).await,
        StateCommand::List => writer.list().await,
        StateCommand::Set {
            key,
            value,
            cas,
            write,
        } => writer.set(key, value, *cas, write.dry_run).await,
        StateCommand::Clear { key, cas, write } => writer.clear(key, *cas, write.dry_run).await,
        StateCommand::Canary { action } => match action {
            CanaryAction::Disable {
                drain_wait,
                idle,
                haproxy_config,
                write,
            } => {
                let target = match idle.until_idle {
                    None => Ok(Target::group(CANARY_KEY)),
                    Some(_) => Target::servers(&Selector {
                        group: Some(CANARY_KEY.into()),
                        haproxy_config: haproxy_config.clone(),
                        ..Selector::default()
                    }),
                };
                writer
                    .drain(
                        "canary disable",
                        target,
                        *drain_wait,
                        idle,
                        floor,
                        write.dry_run,
                    )
                    .await
            }
            CanaryAction::Enable {
                maint_wait,
                ramp,
                write,
            } => {
                let target = Ok(Target::group(CANARY_KEY));
                writer
                    .sequence("canary enable", target, write.dry_run, |t| {
                        plan_undrain(t, *maint_wait, ramp).map_err(refused_invalid)
                    })
                    .await
            }
        },
        StateCommand::Drain {
            select,
            drain_wait,
            idle,
            write,
        } => {
            writer
                .drain(
                    "drain",
                    Target::servers(select),
                    *drain_wait,
                    idle,
                    floor,
                    write.dry_run,
                )
                .await
        }
        StateCommand::Undrain {
            select,
            maint_wait,
            ramp,
            write,
        } => {
            writer
                .sequence("undrain", Target::servers(select), write.dry_run, |t| {
                    plan_undrain(t, *maint_wait, ramp).map_err(refused_invalid)
                })
                .await
        }
        StateCommand::Explain {
            identities,
            haproxy_config,
            haproxy_socket,
        } => {
            writer
                .explain(
                    identities,
                    haproxy_config.as_deref(),
                    haproxy_socket.as_deref(),
                )
                .await
        }
        StateCommand::ReleaseRollback { write } => writer.release_rollback(write.dry_run).await,
        StateCommand::MigrateRecords { write } => writer.migrate_records(write.dry_run).await,
        StateCommand::Status(status) => {
            let status = crate::cli::StatusArgs {
                prometheus: args.prometheus.clone().unwrap_or_default(),
                ..status.clone()
            };
            writer.status(&status).await
        }
    };
    match result {
        Ok(()) => exit::OK,
        Err(f) => report_failure(args.json, &f),
    }
}

impl Writer {
    /// `drain` and `canary disable`: drain, wait (`--drain-wait`, or with
    /// `--until-idle` until the sessions end, at least `floor`), maint.
    async fn drain(
        &self,
        action: &'static str,
        target: Result<Target, Failure>,
        drain_wait: Duration,
        idle: &IdleArgs,
        floor: Duration,
        dry_run: bool,
    ) -> Result<(), Failure> {
        let mut target = target?;
        if idle.until_idle.is_some() {
            let needs = match (&target.group, &target.source) {
                _ if self.confirm.is_none() => {
                    "Prometheus, which it reads the sessions \
                    from: give --prometheus URL (or $GITLAB_HAPROXY_AGENT_PROMETHEUS_URL)"
                }
                (Some(_), None) => {
                    "the HAProxy configuration to know which servers name the \
                    group: give --haproxy-config PATH (a load balancer's)"
                }
                _ => "",
            };
            if !needs.is_empty() {
                return Err(Failure::usage(format!(
                    "--until-idle needs {needs}; nothing written"
                )));
            }
            target.sessions = Some(idle.sessions_selector.clone());
        }
        let wait = idle.until_idle.unwrap_or(drain_wait);
        let purpose = match idle.until_idle {
            Some(_) => WaitFor::Idle { at_least: floor },
            None => WaitFor::Drain,
        };
        self.sequence(action, Ok(target), dry_run, |t| {
            Ok(plan_drain(t, wait, purpose))
        })
        .await
    }

    pub(super) async fn get(&self, key: &str) -> Result<(), Failure> {
        check_key(key)?;
        let (pair, session) = match self.client.get_held_key(&self.full(key)).await? {
            Some((pair, session)) => (Some(pair), session),
            None => (None, None),
        };
        let holder = match session {
            Some(id) => Some(self.client.holder(&id).await),
            None => None,
        };
        let (record, errors) = self.client.key_records(&self.prefix, key).await;
        errors
            .iter()
            .for_each(|e| err_line(&format!("warning: {e}")));
        let records = Records::read(&self.prefix, &record, self.author.at);
        let view = KeyView::new(key, (pair.as_ref(), holder.as_ref()), None, &records);
        let invalid = view.invalid();
        let holds = crate::fleet::held::fleet_holds(self.holds.as_ref()).await;
        if self.json {
            let mut v = json!(view);
            v["ok"] = json!(true);
            v["held"] = holds.json();
            v["agents"] = json!(holds.key_phrase(key, invalid));
            self.print_json(v);
            return Ok(());
        }
        match &pair {
            None => println!(
                "{key}: no key (the servers it selects fall back to their next key, or ready 100%)"
            ),
            Some(_) => print!("{}", key_table(&[view])),
        }
        if let Some(phrase) = holds.key_phrase(key, invalid) {
            println!("agents: {phrase}");
            if let crate::fleet::held::Holds::Unknown(why) = &holds {
                println!("(what the agents hold is not known here: {why})");
            }
        }
        Ok(())
    }

    pub(super) async fn list(&self) -> Result<(), Failure> {
        let (answer, holders) = self.client.list_held(&self.prefix).await?;
        let held = self.held(&holders, None).await;
        let snapshot = build_snapshot(&self.prefix, answer.index, &answer.pairs);
        let with_records: Vec<KvPair> = (answer.pairs.iter().cloned())
            .chain(self.records().await)
            .collect();
        let records = Records::read(&self.prefix, &with_records, self.author.at);
        let mut rows: Vec<(String, &KvPair)> = answer
            .pairs
            .iter()
            .filter_map(|p| {
                let rel = p.key.strip_prefix(&self.prefix)?;
                snapshot
                    .keys
                    .contains_key(rel)
                    .then(|| (rel.to_string(), p))
            })
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let invalid = snapshot.invalid_count();
        let views: Vec<KeyView> = (rows.iter())
            .map(|(k, p)| {
                let entry = snapshot.keys.get(k.as_str()).map(|s| &s.entry);
                KeyView::new(k, (Some(p), held.get(k)), entry, &records)
            })
            .collect();
        let invalid_keys: Vec<String> = (rows.iter().zip(&views))
            .filter(|(_, v)| v.invalid())
            .map(|((k, _), _)| k.clone())
            .collect();
        let holds = crate::fleet::held::fleet_holds(self.holds.as_ref()).await;
        if self.json {
            self.print_json(json!({
                "ok": true,
                "prefix": self.prefix,
                "consul_index": answer.index,
                "keys": views,
                "invalid": invalid,
                "held": holds.json(),
                "agents": holds.phrases(&invalid_keys),
            }));
            return Ok(());
        }
        if rows.is_empty() {
            println!(
                "no keys below {}: agents answer ready 100% for every server, except keys \
                 an agent holds after Consul's data went backwards (its /status, `held`); a \
                 token that may not read the prefix sees no keys either. Consul index {}.",
                self.prefix, answer.index
            );
            if let Some(section) = holds.section(&[]) {
                println!("{section}");
            }
            return Ok(());
        }
        print!("{}", key_table(&views));
        println!(
            "{} key{}, {invalid} invalid{}. Consul index {}.",
            rows.len(),
            if rows.len() == 1 { "" } else { "s" },
            if invalid > 0 {
                " (an agent that knew a valid value of an invalid key answers it; one that did \
                 not skips the key: the next identity on the line decides, and a server with no \
                 later key keeps its state)"
            } else {
                ""
            },
            answer.index
        );
        if let Some(section) = holds.section(&invalid_keys) {
            println!("{section}");
        }
        Ok(())
    }

    pub(super) async fn set(
        &self,
        key: &str,
        value: &str,
        cas: Option<u64>,
        dry_run: bool,
    ) -> Result<(), Failure> {
        check_key(key)?;
        let state = parse_value(value.as_bytes()).map_err(|e| {
            Failure::invalid(format!(
                "refusing {value:?} for {key}: {e}; nothing written"
            ))
        })?;
        self.write_one(key, Change::Set(state), cas, dry_run).await
    }

    pub(super) async fn clear(
        &self,
        key: &str,
        cas: Option<u64>,
        dry_run: bool,
    ) -> Result<(), Failure> {
        check_key(key)?;
        self.write_one(key, Change::Clear, cas, dry_run).await
    }

    /// `set` and `clear`: plans the write of one key ([`plan_write`]) and
    /// runs it through the executor, as every sequence; an unchanged key is
    /// confirmed too, so re-running a command whose write was not confirmed
    /// confirms it.
    pub(super) async fn write_one(
        &self,
        key: &str,
        change: Change,
        cas: Option<u64>,
        dry_run: bool,
    ) -> Result<(), Failure> {
        let (pair, session) = match self.client.get_held_key(&self.full(key)).await? {
            Some((pair, session)) => (Some(pair), session),
            None => (None, None),
        };
        let before = Current::from_pair(pair.as_ref());
        if let Some(expected) = cas {
            if before.index() != expected {
                return Err(Failure::cas_mismatch(key, &before, expected));
            }
        }
        let plan = plan_write(key, before, change);
        let note = plan.keys[0].note;
        let mut run = Run::new(&plan, 0);
        if let Some(id) = session {
            run.held
                .insert(key.to_string(), self.client.holder(&id).await);
        }
        let stop = if dry_run {
            None
        } else if plan.steps.is_empty() {
            self.confirm_written(
                key,
                change,
                &[key.to_string()],
                &run.indexes,
                &CancellationToken::new(),
            )
            .await
            .err()
            .map(|e| match e {
                Unconfirmed::Failed(failure) => Stop::Failed { step: 0, failure },
                Unconfirmed::Interrupted => Stop::Signal {
                    step: 0,
                    name: "SIGINT",
                    code: exit::SIGINT,
                },
            })
        } else {
            self.execute(key, &plan, &Target::group(key), &mut run)
                .await
                .err()
        };
        let written = run.statuses.first() == Some(&StepStatus::Done);
        let confirmed = match stop {
            None => Ok(run.confirmations.first().cloned().flatten()),
            Some(Stop::Setup(f)) => return Err(f),
            Some(Stop::Failed { failure, .. }) if !written && !plan.steps.is_empty() => {
                return Err(failure)
            }
            Some(Stop::Failed { failure, .. }) => Err(failure),
            Some(Stop::Signal { name, code, .. }) => Err(Failure::new(
                code,
                "interrupted",
                match written {
                    true => format!("{key} written; interrupted by {name} while confirming"),
                    false => format!("interrupted by {name}; {key} not written"),
                },
            )),
        };
        let status = match () {
            _ if plan.steps.is_empty() => "unchanged",
            _ if dry_run => "dry run: not written",
            _ => "written",
        };
        if let Some(n) = note {
            eprintln!("note: {n}");
        }
        let mut report = KeyReport::new(&plan.keys[0], status, dry_run, &confirmed);
        report.released_session = run.released.pop().map(|(_, holder)| holder);
        report.session = run.held.remove(key);
        if let (Some(holder), true) = (&report.session, dry_run) {
            let state = change.state().map_or("clear".into(), |s| s.to_string());
            eprintln!(
                "note: {}; this write would release it ({state})",
                super::held::held_note(key, holder)
            );
        }
        self.print(&report);
        match confirmed {
            Ok(_) => Ok(()),
            Err(mut f) => {
                f.reported = self.json;
                Err(f)
            }
        }
    }

    /// `state explain`: what the agent answers for the agent-send line
    /// `identities`, and which key decides. One row key alone is looked up in
    /// the configuration ([`config_path`]); without one, when that row key
    /// has no value and group keys are set, the answer is `unknown` (exit
    /// 0): which groups the server's line names is not known here.
    pub(super) async fn explain(
        &self,
        identities: &[String],
        config: Option<&Path>,
        socket: Option<&Path>,
    ) -> Result<(), Failure> {
        let mut line = identities.join(" ");
        // `<backend>/<server>` of the server, for --haproxy-socket: the one
        // found in the configuration, else the row key given first.
        let mut server_id = identities.first().filter(|i| is_row_key(i)).cloned();
        let lone_row_key = identities.len() == 1 && is_row_key(&identities[0]);
        let explicit = config.is_some();
        let mut config = config_path(config).filter(|_| lone_row_key);
        if let Some(path) = config.clone() {
            let servers = haproxy::servers_from_config(&path)?;
            // By row key, else by `<backend>/<server>`: a server-template
            // server (`web/web-tpl1`) has no row key of its own.
            let found = servers
                .iter()
                .find(|s| s.row_key() == Some(line.as_str()))
                .or_else(|| servers.iter().find(|s| s.id() == line))
                .filter(|s| !s.identities().is_empty())
                .map(|s| (s.id(), s.identities().join(" ")));
            match found {
                Some((id, found)) => {
                    server_id = Some(id);
                    line = found;
                }
                // The default configuration is this load balancer's; the
                // server may be another's: answered as with none.
                None if !explicit => config = None,
                None => {
                    return Err(Failure::invalid(format!(
                        "no enrolled server with row key or name {line} in {}",
                        path.display()
                    )))
                }
            }
        }
        let ids = parse_line(line.as_bytes()).map_err(|e| {
            Failure::invalid(format!(
                "the agent refuses the agent-send line {line:?}: {e}"
            ))
        })?;
        let (answer, holders) = self.client.list_held(&self.prefix).await?;
        let named: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
        let held = self.held(&holders, Some(&named)).await;
        let snapshot = build_snapshot(&self.prefix, answer.index, &answer.pairs);
        let raw: HashMap<&str, &KvPair> = answer
            .pairs
            .iter()
            .filter_map(|p| p.key.strip_prefix(&self.prefix).map(|r| (r, p)))
            .collect();
        let result = snapshot.lookup(ids.iter().copied());
        let deciding = result.decided_by();
        // The group keys set now, any of which decides the server if its
        // line names it: asked about when only the row key is known.
        let mut groups_set: Vec<(String, String)> = raw
            .iter()
            .filter(|(k, _)| !is_row_key(k) && snapshot.keys.contains_key(**k))
            .map(|(k, p)| (k.to_string(), display_value(&p.value)))
            .collect();
        groups_set.sort();
        let unknown =
            lone_row_key && config.is_none() && deciding.is_none() && !groups_set.is_empty();
        let rows: Vec<(String, Option<String>, &'static str)> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let value = raw.get(id).map(|p| display_value(&p.value));
                let skipped = matches!(
                    snapshot.keys.get(*id).map(|k| &k.entry),
                    Some(Entry::Invalid(_))
                );
                let role = match (deciding, &value) {
                    (Some(d), _) if d == i => "decides",
                    (_, Some(_)) if skipped => {
                        "skipped (an invalid value; the agent answers its last valid value if it knew one)"
                    }
                    (Some(d), Some(_)) if i > d => "not read (an earlier identity decides)",
                    (_, None) => "no key",
                    (_, Some(_)) => "not read",
                };
                (id.to_string(), value, role)
            })
            .chain(groups_set.iter().filter(|_| unknown).map(|(k, v)| {
                (
                    k.clone(),
                    Some(v.clone()),
                    "decides if the server's line names it",
                )
            }))
            .collect();
        let (reply, summary) = match result {
            _ if unknown => (
                None,
                format!(
                    "unknown: {line} has no key, so the server's groups decide, and which \
                     groups its agent-send line names is not known here. Group keys set: {}. \
                     Give the line's identities (`state explain {line} zone-b canary`) or \
                     --haproxy-config PATH",
                    groups_set
                        .iter()
                        .map(|(k, v)| format!("{k} = {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            Answer::State {
                state,
                decided_by: Some(d),
            } => {
                let skipped: Vec<String> = ids[..d]
                    .iter()
                    .filter_map(|id| match snapshot.keys.get(*id).map(|k| &k.entry) {
                        Some(Entry::Invalid(e)) => Some(format!(
                            "key {id} holds an invalid value ({e}), skipped where no valid \
                             value of it is known; an agent that knew one answers that \
                             (held: invalid value)"
                        )),
                        _ => None,
                    })
                    .collect();
                let skipped = if skipped.is_empty() {
                    String::new()
                } else {
                    format!("; {}", skipped.join("; "))
                };
                (
                    Some(state.reply_text()),
                    format!(
                        "{} (decided by key {} = {state}{skipped})",
                        state.reply_text(),
                        ids[d]
                    ),
                )
            }
            // A snapshot built from Consul here is never provisional.
            Answer::Withheld { state, .. } => (
                None,
                format!(
                    "nothing: {} withheld until the agent reads Consul",
                    state.reply_text()
                ),
            ),
            Answer::State {
                state,
                decided_by: None,
            } => (
                Some(state.reply_text()),
                format!(
                    "{} (no identity has a key: the default)",
                    state.reply_text()
                ),
            ),
            Answer::Invalid { decided_by } => {
                let why = match snapshot.keys.get(ids[decided_by]).map(|k| &k.entry) {
                    Some(Entry::Invalid(e)) => e.to_string(),
                    _ => "invalid".into(),
                };
                (
                    None,
                    format!(
                        "key {} holds an invalid value ({why}): an agent that knew a valid \
                         value of it answers that (held: invalid value); one that did not \
                         answers nothing, since no later identity has a key, and HAProxy \
                         keeps the server's current state",
                        ids[decided_by]
                    ),
                )
            }
        };
        // What the agents hold for the identities read before the one that
        // decides (or all of them): a held key decides where it is held.
        let holds = crate::fleet::held::fleet_holds(self.holds.as_ref()).await;
        let read = deciding.map_or(ids.len(), |d| d + 1);
        let agents: Vec<(String, String)> = ids[..read]
            .iter()
            .filter_map(|id| {
                let bad = matches!(
                    snapshot.keys.get(*id).map(|k| &k.entry),
                    Some(Entry::Invalid(_))
                );
                Some((id.to_string(), holds.key_phrase(id, bad)?))
            })
            .collect();
        let live = match (socket, &server_id) {
            (Some(path), Some(id)) => {
                let (backend, server) = id.split_once('/').unwrap_or((id.as_str(), ""));
                match live::server_from_socket(path, backend, server)? {
                    Some(live) => Some(live),
                    None => {
                        return Err(Failure::invalid(format!(
                            "HAProxy at {} has no server {id}",
                            path.display()
                        )))
                    }
                }
            }
            (Some(_), None) => {
                return Err(Failure::usage(
                    "--haproxy-socket needs the server's row key <backend>/<server> first"
                        .to_string(),
                ))
            }
            _ => None,
        };
        if self.json {
            self.print_json(json!({
                "ok": true,
                "haproxy": live,
                "line": line,
                "line_from": config.as_ref().map(|p| p.display().to_string()),
                "reply": reply,
                "answer": if unknown { "unknown" } else { result.kind().as_str() },
                "decided_by": deciding.map(|d| ids[d]),
                "identities": rows.iter().map(|(id, value, role)| json!({
                    "identity": id, "value": value, "role": role, "session": held.get(id),
                })).collect::<Vec<_>>(),
                "consul_index": answer.index,
                "agents": agents.iter().cloned().collect::<std::collections::BTreeMap<String, String>>(),
                "held": holds.json(),
            }));
            return Ok(());
        }
        println!("agent-send line: {line}");
        println!("answer: {summary}");
        for (id, phrase) in &agents {
            println!("agents: key {id}: {phrase}");
        }
        if let crate::fleet::held::Holds::Unknown(why) = &holds {
            println!("(what the agents hold is not known here: {why}; one holding a key, after Consul lost data or for a key hidden from it, answers otherwise)");
        }
        let table_rows: Vec<Vec<String>> = rows
            .into_iter()
            .map(|(id, value, role)| {
                vec![id, value.unwrap_or_else(|| "-".into()), role.to_string()]
            })
            .collect();
        print!("{}", table(&["IDENTITY", "VALUE", "ROLE"], &table_rows));
        for id in named.iter().filter(|id| held.contains_key(*id)) {
            println!("{}.", super::held::held_note(id, &held[id]));
        }
        println!("Consul index {}.", answer.index);
        if let (Some(live), Some(path)) = (&live, socket) {
            println!("{}", live.describe(path));
        }
        Ok(())
    }
}
