//! The source layout's rules, checked on the files themselves: no import
//! cycle between the modules of `src/` and the pure core's `core/src/`
//! (also none through a re-export), no file of either over
//! [`FILE_LINE_BUDGET`] lines and the writer (`src/writer/`) under its line
//! budget, outside `#[cfg(test)]` items; the core crate depends on no
//! runtime, HTTP stack or clock.
//!
//! Run alone with `cargo test --test layout`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most lines `src/writer/**/*.rs` may hold outside `#[cfg(test)]` items
/// (4,825 plus `writer/author.rs`, which came from `cli.rs`, with its
/// fallback to the process's uid and host, and the write generation's
/// errors; plus `writer/held.rs` and the lines of `get`, `list`, `explain`
/// and the reports that name a key's Consul session, 253: a write releases
/// the session holding its key, so that the session ending cannot delete
/// the write; plus `writer::author::process_author`, 18, which reads
/// `/proc` and so left the pure core's `model::meta`; plus 78 for the
/// records beside the prefix: `get`, `list` and `status` read both places,
/// a token refused the sibling prefix gets them below the prefix with a
/// warning, and `state migrate-records`; their Consul side is in
/// `consul/records.rs`).
const WRITER_LINE_BUDGET: usize = 5_243;

/// Most lines a file of `src/` may hold outside `#[cfg(test)]` items: 800.
const FILE_LINE_BUDGET: usize = 800;

/// Folders of `src/` left out of [`FILE_LINE_BUDGET`] for now, with why.
const OVER_BUDGET_FOR_NOW: &[(&str, &str)] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The pure core's sources (the crate `gitlab-haproxy-agent-core`).
fn core_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("core/src")
}

/// The name of the core crate in paths of the root package.
const CORE_CRATE: &str = "gitlab_haproxy_agent_core";

/// Every Rust file of both crates: `src/` and `core/src/`.
fn all_rust_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    rust_files(&core_src(), &mut files);
    files
}

/// A file's path for messages: `src/...` or `core/src/...`.
fn shown(file: &Path) -> String {
    file.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap()
        .display()
        .to_string()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The lines of `text` outside `#[cfg(test)]` items (the item after the
/// attribute is skipped to its closing brace, or to its `;`).
fn non_test_lines(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            out.push(line);
            continue;
        }
        let mut depth = 0i64;
        let mut opened = false;
        for item in lines.by_ref() {
            let code = item.split("//").next().unwrap_or("");
            depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
            opened |= code.contains('{');
            if (opened && depth <= 0) || (!opened && code.trim_end().ends_with(';')) {
                break;
            }
        }
    }
    out
}

/// The module path of a file below `src/` (`writer::confirm`; `lib.rs` and
/// `main.rs` are the crate root, `mod.rs` its directory's module), or below
/// `core/src/`, under `core` (`core::decision::machine`).
fn module_of(file: &Path) -> Vec<String> {
    let mut parts = crate_root_of(file);
    let rel = match file.strip_prefix(core_src()) {
        Ok(rel) => rel,
        Err(_) => file.strip_prefix(src()).unwrap(),
    };
    parts.extend(
        rel.iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string()),
    );
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The module path of the crate root a file belongs to: `[]` for `src/`,
/// `[core]` for `core/src/`.
fn crate_root_of(file: &Path) -> Vec<String> {
    match file.starts_with(core_src()) {
        true => vec!["core".to_string()],
        false => Vec::new(),
    }
}

/// Every `crate::`, `super::`, `self::` or `gitlab_haproxy_agent_core::`
/// path in `code`, and the paths of `use` statements that start with a
/// child module's name, expanded through `{...}` groups, as segment lists
/// from the root package's crate root (the core's under `core`); `root` is
/// the crate root of the file `code` comes from.
fn paths_in(
    code: &str,
    root: &[String],
    module: &[String],
    children: &BTreeSet<String>,
) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !ident(chars[i]) || (i > 0 && (ident(chars[i - 1]) || chars[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && ident(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let mut before = start;
        while before > 0 && chars[before - 1].is_whitespace() {
            before -= 1;
        }
        let after_use = before >= 3
            && chars[before - 3..before] == ['u', 's', 'e']
            && (before == 3 || !ident(chars[before - 4]));
        let continues = chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':');
        let base: Vec<String> = match word.as_str() {
            _ if !continues => continue,
            "crate" => root.to_vec(),
            CORE_CRATE => vec!["core".to_string()],
            "self" => module.to_vec(),
            "super" => module[..module.len().saturating_sub(1)].to_vec(),
            w if after_use && children.contains(w) => {
                let mut m = module.to_vec();
                m.push(w.to_string());
                m
            }
            _ => continue,
        };
        let mut end = i;
        let tail = expand(&chars, &mut end, &ident);
        for t in tail {
            let mut path = base.clone();
            let mut segs = t.into_iter().peekable();
            // `super::super::x`
            while segs.peek().is_some_and(|s| s == "super") {
                segs.next();
                path.pop();
            }
            path.extend(segs);
            out.push(path);
        }
        i = end;
    }
    out
}

/// The `::a::b`, `::{a, b::c}` continuations at `chars[*i..]`.
fn expand(chars: &[char], i: &mut usize, ident: &dyn Fn(char) -> bool) -> Vec<Vec<String>> {
    let skip_ws = |i: &mut usize| {
        while *i < chars.len() && chars[*i].is_whitespace() {
            *i += 1;
        }
    };
    if !(chars.get(*i) == Some(&':') && chars.get(*i + 1) == Some(&':')) {
        return vec![Vec::new()];
    }
    *i += 2;
    skip_ws(i);
    if chars.get(*i) == Some(&'{') {
        *i += 1;
        let mut all = Vec::new();
        loop {
            skip_ws(i);
            match chars.get(*i) {
                None => break,
                Some('}') => {
                    *i += 1;
                    break;
                }
                Some(',') => *i += 1,
                Some(c) if ident(*c) => {
                    let s = *i;
                    while *i < chars.len() && ident(chars[*i]) {
                        *i += 1;
                    }
                    let head: String = chars[s..*i].iter().collect();
                    for mut t in expand(chars, i, ident) {
                        if head != "self" {
                            t.insert(0, head.clone());
                        }
                        all.push(t);
                    }
                }
                Some(_) => *i += 1,
            }
        }
        return all;
    }
    let s = *i;
    while *i < chars.len() && ident(chars[*i]) {
        *i += 1;
    }
    let head: String = chars[s..*i].iter().collect();
    if head.is_empty() {
        return vec![Vec::new()];
    }
    expand(chars, i, ident)
        .into_iter()
        .map(|mut t| {
            t.insert(0, head.clone());
            t
        })
        .collect()
}

/// The module graph of `src/` and `core/src/`, from non-test code: an edge
/// from each file's module to the deepest module each of its paths names
/// (itself excluded); with `through_reexports`, looking through `pub use`
/// re-exports to the module that defines the item, else to the module that
/// re-exports it. A `pub use` of a whole module (the core's modules in the
/// root package: `pub use gitlab_haproxy_agent_core::model`) is that module
/// either way.
fn module_graph(through_reexports: bool) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = all_rust_files();
    files.retain(|f| !f.ends_with("main.rs"));
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(f)).collect();
    let name = |m: &[String]| {
        if m.is_empty() {
            "crate".to_string()
        } else {
            m.join("::")
        }
    };
    // Per file: its module and the paths it names; per module, the paths
    // its `pub use` statements re-export, by the name they export.
    let mut uses = Vec::new();
    let mut reexports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for file in &files {
        let module = module_of(file);
        let root = crate_root_of(file);
        let children: BTreeSet<String> = modules
            .iter()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(&module))
            .map(|m| m.last().unwrap().clone())
            .collect();
        let text = std::fs::read_to_string(file).unwrap();
        let code: String = non_test_lines(&text)
            .into_iter()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for stmt in code.split(';') {
            if let Some(rest) = stmt.trim().strip_prefix("pub use ") {
                for path in paths_in(&format!("use {rest}"), &root, &module, &children) {
                    if let Some(last) = path.last() {
                        reexports
                            .entry(module.clone())
                            .or_default()
                            .insert(last.clone(), path.clone());
                    }
                }
            }
        }
        uses.push((module.clone(), paths_in(&code, &root, &module, &children)));
    }
    // `pub use` statements that re-export a whole module: an alias of it.
    let aliases: BTreeMap<Vec<String>, Vec<String>> = reexports
        .iter()
        .flat_map(|(module, by_name)| {
            by_name.iter().map(move |(name, target)| {
                let mut alias = module.clone();
                alias.push(name.clone());
                (alias, target.clone())
            })
        })
        .filter(|(_, target)| modules.contains(target))
        .collect();
    let resolve = |path: &[String]| -> Vec<String> {
        let mut path = path.to_vec();
        for _ in 0..8 {
            let aliased = (1..=path.len())
                .rev()
                .find_map(|n| Some((n, aliases.get(&path[..n])?)));
            if let Some((n, target)) = aliased {
                path = target.iter().chain(&path[n..]).cloned().collect();
                continue;
            }
            let n = (0..=path.len())
                .rev()
                .find(|n| modules.contains(&path[..*n]))
                .unwrap_or(0);
            let via = path
                .get(n)
                .and_then(|item| reexports.get(&path[..n])?.get(item));
            match via {
                Some(p) if through_reexports && *p != path => {
                    path = p.iter().chain(&path[n + 1..]).cloned().collect()
                }
                _ => return path[..n].to_vec(),
            }
        }
        path
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, paths) in uses {
        let edges = graph.entry(name(&module)).or_default();
        for path in paths {
            let target = resolve(&path);
            if target != module {
                edges.insert(name(&target));
            }
        }
    }
    graph
}

/// One cycle of `graph`, if it has one (depth-first search).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_import_cycle_between_modules() {
    let graph = module_graph(true);
    assert!(
        graph
            .get("writer::commands")
            .is_some_and(|e| e.contains("writer::plan")),
        "the module graph misses a known import: {graph:#?}"
    );
    // Through the root package's re-export of a core module, and within the
    // core.
    for (from, to) in [
        ("agent::watcher", "core::route"),
        ("agent::responder", "core::model::identity"),
        ("core::decision::machine", "core::decision::phase"),
        ("core::decision::phase", "core::model::answer"),
    ] {
        assert!(
            graph.get(from).is_some_and(|e| e.contains(to)),
            "the module graph misses {from} -> {to}: {graph:#?}"
        );
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle between modules: {}", cycle.join(" -> "));
    }
}

/// A module that imports an item through a module that re-exports it
/// depends on that module too: `profile` taking `Answer` from `http`, which
/// imports `profile`, is a cycle a reader has to untangle.
#[test]
fn no_import_cycle_through_a_reexport() {
    let graph = module_graph(false);
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import cycle between modules, through a re-export: {}",
            cycle.join(" -> ")
        );
    }
}

/// The core's model is its bottom layer: no module of `core::model` names
/// the decision core or the route policy, which are built on it.
#[test]
fn the_model_names_nothing_above_it() {
    let graph = module_graph(true);
    let up: Vec<String> = graph
        .iter()
        .filter(|(module, _)| *module == "core::model" || module.starts_with("core::model::"))
        .flat_map(|(module, edges)| {
            edges
                .iter()
                .filter(|e| !(*e == "core::model" || e.starts_with("core::model::")))
                .map(move |e| format!("{module} -> {e}"))
        })
        .collect();
    assert!(
        up.is_empty(),
        "the model imports from above it: {}",
        up.join(", ")
    );
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let mut graph = module_graph(true);
    graph
        .entry("model".into())
        .or_default()
        .insert("writer".into());
    graph
        .entry("writer".into())
        .or_default()
        .insert("model::value".into());
    graph
        .entry("model::value".into())
        .or_default()
        .insert("model".into());
    assert!(find_cycle(&graph).is_some());
}

#[test]
fn the_writer_stays_under_its_line_budget() {
    let mut files = Vec::new();
    rust_files(&src().join("writer"), &mut files);
    // A `tests.rs` is a `#[cfg(test)]` module in a file of its own.
    let lines: usize = files
        .iter()
        .filter(|f| !f.ends_with("tests.rs"))
        .map(|f| non_test_lines(&std::fs::read_to_string(f).unwrap()).len())
        .sum();
    assert!(
        lines <= WRITER_LINE_BUDGET,
        "src/writer holds {lines} lines outside #[cfg(test)] items, over its budget of \
         {WRITER_LINE_BUDGET}: shrink it before adding to it"
    );
}

#[test]
fn no_source_file_over_its_line_budget() {
    let over: Vec<String> = all_rust_files()
        .iter()
        .filter(|f| {
            !OVER_BUDGET_FOR_NOW
                .iter()
                .any(|(dir, _)| shown(f).starts_with(dir))
                && !f.ends_with("tests.rs")
        })
        .filter_map(|f| {
            let lines = non_test_lines(&std::fs::read_to_string(f).unwrap()).len();
            (lines > FILE_LINE_BUDGET).then(|| format!("{}: {lines}", shown(f)))
        })
        .collect();
    assert!(
        over.is_empty(),
        "files over {FILE_LINE_BUDGET} lines outside #[cfg(test)] items (split them by concern): {}",
        over.join(", ")
    );
}

/// Crates the pure core may not depend on, directly or through another:
/// an async runtime, an HTTP stack, an event loop or a socket library. Its
/// rules take the time and every answer as arguments.
const NOT_IN_THE_CORE: &[&str] = &[
    "tokio",
    "tokio-util",
    "reqwest",
    "hyper",
    "hyper-util",
    "http",
    "mio",
    "socket2",
    "ureq",
];

/// The names of the packages `package` depends on, directly or through
/// another, as Cargo resolved them (`cargo metadata`, as `cargo tree -p`
/// sees them on this host: `--filter-platform`, so that another platform's
/// dependencies, never downloaded here, are not asked for), build
/// dependencies included, dev-dependencies left out.
fn resolved_dependencies(package: &str) -> BTreeSet<String> {
    let rustc = std::process::Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc -vV runs");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host");
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &host])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let name_of = |id: &str| {
        meta["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .and_then(|p| p["name"].as_str())
            .unwrap_or_else(|| panic!("no package {id} in cargo metadata"))
            .to_string()
    };
    let nodes = meta["resolve"]["nodes"].as_array().unwrap();
    let root = nodes
        .iter()
        .find(|n| name_of(n["id"].as_str().unwrap()) == package)
        .unwrap_or_else(|| panic!("no package {package} in the workspace"));
    let mut seen = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(node) = todo.pop() {
        for dep in node["deps"].as_array().unwrap() {
            let not_dev = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"] != "dev");
            let id = dep["pkg"].as_str().unwrap();
            if not_dev && seen.insert(name_of(id)) {
                todo.extend(nodes.iter().find(|n| n["id"] == id));
            }
        }
    }
    seen
}

/// The boundary of the pure core is its crate's: nothing in its dependency
/// tree performs I/O for it (issue: the core was pure by convention only).
#[test]
fn the_core_crate_depends_on_no_runtime_and_no_http() {
    let deps = resolved_dependencies("gitlab-haproxy-agent-core");
    assert!(
        deps.contains("serde"),
        "the core's dependencies were not read: {deps:?}"
    );
    let found: Vec<&&str> = NOT_IN_THE_CORE
        .iter()
        .filter(|name| deps.contains(**name))
        .collect();
    assert!(
        found.is_empty(),
        "gitlab-haproxy-agent-core depends on {found:?} (core/Cargo.toml): the core takes \
         answers and the time as arguments; perform I/O in the root package"
    );
    let root = resolved_dependencies("gitlab-haproxy-agent");
    assert!(
        root.contains("tokio") && root.contains("gitlab-haproxy-agent-core"),
        "the check cannot see the root package's runtime: {root:?}"
    );
}

/// Calls that read the clock or perform I/O, not written in the core's
/// non-test code: the core is handed the time and every answer. Addresses
/// (`std::net::SocketAddr`) are values; sockets and name lookups are not.
const NOT_CALLED_IN_THE_CORE: &[&str] = &[
    "Instant::now",
    "SystemTime::now",
    "std::fs",
    "TcpStream",
    "TcpListener",
    "UdpSocket",
    "ToSocketAddrs",
    "std::process",
    "std::env",
    "std::thread",
];

#[test]
fn the_core_reads_no_clock_and_performs_no_io() {
    let mut files = Vec::new();
    rust_files(&core_src(), &mut files);
    let found: Vec<String> = files
        .iter()
        .filter(|f| !f.ends_with("tests.rs"))
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            non_test_lines(&text)
                .into_iter()
                .map(|l| l.split("//").next().unwrap_or("").to_string())
                .filter_map(|code| {
                    let call = NOT_CALLED_IN_THE_CORE.iter().find(|c| code.contains(**c))?;
                    Some(format!("{}: {call}", shown(f)))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        found.is_empty(),
        "the core reads the clock or performs I/O: {}",
        found.join(", ")
    );
}

/// The process environment is read, never changed: `set_var` and
/// `remove_var` race with any thread reading it (unsafe since Rust 2024),
/// and the defaults file's values reach clap as defaults instead
/// (`cli::defaults::with_file_defaults`).
#[test]
fn nothing_changes_the_process_environment() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("core/src"),
        &mut files,
    );
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"),
        &mut files,
    );
    let found: Vec<String> = files
        .iter()
        .filter(|f| !f.ends_with("tests/layout.rs"))
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let rel = f
                .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                .unwrap()
                .display()
                .to_string();
            text.lines()
                .enumerate()
                .filter(|(_, l)| l.contains("env::set_var") || l.contains("env::remove_var"))
                .map(|(n, _)| format!("{rel}:{}", n + 1))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        found.is_empty(),
        "the process environment is changed at {}",
        found.join(", ")
    );
}
