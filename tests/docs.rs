//! The documentation against the code and itself: the README stays a front
//! door (under 20,000 bytes, the two set-up commands, a link to every page),
//! every relative link of the README, `docs/` and `runbook/` leads to a file
//! and a heading that exist, every option is on its page (daemon options in
//! docs/options.md, the writer's in docs/writer.md) and every metric the
//! agent declares in docs/metrics.md, every `runbook: X` the code prints
//! names a runbook heading, and every alert's section opens with its first
//! five minutes.
//!
//! Run alone with `cargo nextest run --test docs`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory as _;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The Markdown pages of a folder, sorted, relative to the repository.
fn pages(dir: &str) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("{dir}/{n}"))
        .collect();
    out.sort();
    out
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// A heading's anchor as GitLab and GitHub make it: lower case,
/// punctuation dropped, spaces to hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn headings(text: &str) -> Vec<String> {
    prose(text)
        .into_iter()
        .filter(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim().to_string())
        .collect()
}

/// The `](target)` links of a Markdown text's prose.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(end) = tail.find(')') else { break };
            out.push(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    out
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = read("README.md");
    assert!(
        readme.len() < 20_000,
        "README.md is {} bytes: move reference text into docs/",
        readme.len()
    );
    // The two set-up commands, exactly.
    let mut commands = Vec::new();
    let mut in_shell = false;
    for line in readme.lines() {
        if let Some(lang) = line.strip_prefix("```") {
            in_shell = !in_shell && lang == "shell";
            continue;
        }
        if in_shell && line.starts_with("./scripts/") {
            commands.push(line.split_whitespace().next().unwrap().to_string());
        }
    }
    commands.dedup();
    assert_eq!(commands, ["./scripts/demo.sh", "./scripts/test.sh"]);
    let linked: BTreeSet<String> = links(&readme).into_iter().collect();
    let mut wanted = pages("docs");
    wanted.push("runbook/README.md".into());
    wanted.push("BENCHMARKS.md".into());
    let missing: Vec<_> = wanted.iter().filter(|p| !linked.contains(*p)).collect();
    assert!(missing.is_empty(), "README.md links none of {missing:?}");
}

#[test]
fn every_relative_link_leads_to_a_file_and_a_heading() {
    let mut docs = vec!["README.md".to_string(), "BENCHMARKS.md".to_string()];
    docs.extend(pages("docs"));
    docs.extend(pages("runbook"));
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let dir = Path::new(doc).parent().unwrap();
        for link in links(&read(doc)) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, frag) = link.split_once('#').unwrap_or((&link, ""));
            let target: PathBuf = if file.is_empty() {
                PathBuf::from(doc)
            } else {
                dir.join(file)
            };
            let path = root().join(&target);
            if !path.exists() {
                broken.push(format!("{doc}: {link} (no {})", target.display()));
                continue;
            }
            if !frag.is_empty() {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if !headings(&text).iter().any(|h| anchor(h) == frag) {
                    broken.push(format!("{doc}: {link} (no heading #{frag})"));
                }
            }
            checked += 1;
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked > 100, "only {checked} links checked");
}

/// Every option of the daemon and of `check-ready` is on docs/options.md
/// (with its variable), every option of `state` on docs/writer.md.
#[test]
fn every_option_is_on_its_page() {
    let options = read("docs/options.md");
    let writer = read("docs/writer.md");
    let mut missing = Vec::new();
    let mut checked = 0;
    fn walk(
        cmd: &clap::Command,
        path: &str,
        page: &str,
        text: &str,
        missing: &mut Vec<String>,
        checked: &mut usize,
    ) {
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if matches!(long, "help" | "version") || arg.is_hide_set() {
                continue;
            }
            *checked += 1;
            if !text.contains(&format!("--{long}")) {
                missing.push(format!("{path} --{long} is not on {page}"));
            }
            if let Some(env) = arg.get_env() {
                let env = env.to_string_lossy();
                if !text.contains(&*env) {
                    missing.push(format!("{path} --{long}: ${env} is not on {page}"));
                }
            }
        }
        for sub in cmd.get_subcommands() {
            let name = format!("{path} {}", sub.get_name());
            walk(sub, &name, page, text, missing, checked);
        }
    }
    let cli = gitlab_haproxy_agent::cli::Cli::command();
    // The daemon's own options (the root command, without subcommands).
    let mut root_only = clap::Command::new("gitlab-haproxy-agent");
    for arg in cli.get_arguments() {
        root_only = root_only.arg(arg.clone());
    }
    walk(
        &root_only,
        "gitlab-haproxy-agent",
        "docs/options.md",
        &options,
        &mut missing,
        &mut checked,
    );
    for sub in cli.get_subcommands() {
        let (page, text) = if sub.get_name() == "state" {
            ("docs/writer.md", &writer)
        } else {
            ("docs/options.md", &options)
        };
        let name = format!("gitlab-haproxy-agent {}", sub.get_name());
        walk(sub, &name, page, text, &mut missing, &mut checked);
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    assert!(checked > 40, "only {checked} options checked");
}

/// The metric families the agent declares (`f.int_gauge("name", ...)` and
/// the like in src/agent), each named on docs/metrics.md.
fn declared_metrics() -> BTreeSet<String> {
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    let mut all = Vec::new();
    files(&root().join("src/agent"), &mut all);
    let methods = [
        "int_gauge(",
        "gauge(",
        "int_counter(",
        "int_counter_vec(",
        "int_gauge_vec(",
        "gauge_vec(",
        "histogram(",
    ];
    let mut names = BTreeSet::new();
    for file in all {
        let text = std::fs::read_to_string(&file).unwrap();
        for method in methods {
            for (at, _) in text.match_indices(&format!("f.{method}")) {
                let rest = text[at + 2 + method.len()..].trim_start();
                if let Some(lit) = rest.strip_prefix('"') {
                    let name = &lit[..lit.find('"').unwrap()];
                    names.insert(format!("gitlab_haproxy_agent_{name}"));
                }
            }
        }
    }
    names
}

#[test]
fn every_metric_is_on_its_page() {
    let page = read("docs/metrics.md");
    let declared = declared_metrics();
    assert!(declared.len() > 50, "only {} metrics found", declared.len());
    let missing: Vec<_> = declared
        .iter()
        .filter(|m| !page.contains(&format!("`{m}`")) && !page.contains(&format!("`{m}{{")))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics missing from docs/metrics.md: {missing:?}"
    );
    // And nothing listed that the agent does not export.
    let listed: BTreeSet<String> = page
        .split('`')
        .filter(|w| w.starts_with("gitlab_haproxy_agent_") && !w.contains(':'))
        .map(|w| w.split('{').next().unwrap().to_string())
        .collect();
    let unknown: Vec<_> = listed.difference(&declared).collect();
    assert!(
        unknown.is_empty(),
        "docs/metrics.md lists metrics the agent does not declare: {unknown:?}"
    );
}

/// `runbook: A, B, C)` and `runbook "A"` in the code's messages: each name
/// a heading of a runbook page.
fn runbook_names_in(text: &str) -> Vec<String> {
    // Join string continuations (`\` at a line's end) as Rust does.
    let mut joined = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if let Some(head) = line.strip_suffix('\\') {
            joined.push_str(head);
            if let Some(next) = lines.peek_mut() {
                *next = next.trim_start();
            }
        } else {
            joined.push_str(line);
            joined.push('\n');
        }
    }
    let mut names = Vec::new();
    for (at, _) in joined.match_indices("runbook") {
        let rest = &joined[at + "runbook".len()..];
        if let Some(list) = rest.strip_prefix(": ") {
            let end = list.find([')', '"', '\n']).unwrap_or(list.len());
            names.extend(list[..end].split(", ").map(|s| s.trim().to_string()));
        } else if let Some(quoted) = rest.strip_prefix(" \\\"") {
            let end = quoted.find("\\\"").unwrap_or(quoted.len());
            names.push(quoted[..end].to_string());
        }
    }
    names
}

#[test]
fn every_runbook_name_the_code_prints_is_a_heading() {
    let mut headings_all = BTreeSet::new();
    for page in pages("runbook") {
        headings_all.extend(headings(&read(&page)));
    }
    let mut files = Vec::new();
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    walk(&root().join("src"), &mut files);
    let mut named = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for name in runbook_names_in(&text) {
            named.push((
                file.strip_prefix(root()).unwrap().display().to_string(),
                name,
            ));
        }
    }
    assert!(named.len() >= 5, "only {named:?}");
    let missing: Vec<_> = named
        .iter()
        .filter(|(_, n)| !headings_all.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "runbook names the code prints with no heading: {missing:?}"
    );
}

#[test]
fn the_runbook_name_scan_reads_messages_as_printed() {
    let src =
        "format!(\"x (runbook: Agent down, Consul sync \\\n   stale, HAProxy not asking), y\"); \
               eprintln!(\"(runbook \\\"Agent down\\\"), z\");";
    assert_eq!(
        runbook_names_in(src),
        [
            "Agent down",
            "Consul sync stale",
            "HAProxy not asking",
            "Agent down"
        ]
    );
}

/// An alert's section (a runbook heading whose first paragraph names a
/// `GitLabHAProxyAgent...` alert) opens with "First five minutes" in at most
/// five lines, before its meaning.
#[test]
fn every_alert_section_opens_with_its_first_five_minutes() {
    let mut sections = 0;
    let mut wrong = Vec::new();
    for page in pages("runbook") {
        let text = read(&page);
        for section in text.split("\n## ").skip(1) {
            let title = section.lines().next().unwrap();
            let body: Vec<&str> = section.lines().skip(1).collect();
            let paragraphs: Vec<Vec<&str>> = body
                .split(|l| l.trim().is_empty())
                .filter(|p| !p.is_empty())
                .map(|p| p.to_vec())
                .collect();
            let Some(first) = paragraphs.first() else {
                continue;
            };
            if !first[0].starts_with("`GitLabHAProxyAgent") {
                continue;
            }
            sections += 1;
            let ok = paragraphs
                .get(1)
                .is_some_and(|p| p == &["**First five minutes.**"])
                && paragraphs.get(2).is_some_and(|p| p.len() <= 5)
                && paragraphs
                    .get(3)
                    .is_some_and(|p| p[0].starts_with("**Meaning.**"));
            if !ok {
                wrong.push(format!("{page}: {title}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "alert sections without their first five minutes (at most five lines) before Meaning: {wrong:?}"
    );
    assert!(sections >= 20, "only {sections} alert sections");
}
