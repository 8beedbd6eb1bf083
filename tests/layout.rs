//! The source layout's rules, checked on the files themselves: no import
//! cycle between the modules of `src/` (also none through a re-export), no
//! file of `src/` over [`FILE_LINE_BUDGET`] lines and the writer
//! (`src/writer/`) under its line budget, outside `#[cfg(test)]` items.
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
/// the write; plus 78 for the records beside the prefix: `get`, `list` and
/// `status` read both places, a token refused the sibling prefix gets them
/// below the prefix with a warning, and `state migrate-records`; their
/// Consul side is in `consul/records.rs`).
const WRITER_LINE_BUDGET: usize = 5_225;

/// Most lines a file of `src/` may hold outside `#[cfg(test)]` items: 800.
const FILE_LINE_BUDGET: usize = 800;

/// Folders of `src/` left out of [`FILE_LINE_BUDGET`] for now, with why.
const OVER_BUDGET_FOR_NOW: &[(&str, &str)] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
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
/// `main.rs` are the crate root, `mod.rs` its directory's module).
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Every `crate::`, `super::` or `self::` path in `code`, and the paths of
/// `use` statements that start with a child module's name, expanded through
/// `{...}` groups, as segment lists relative to the crate root.
fn paths_in(code: &str, module: &[String], children: &BTreeSet<String>) -> Vec<Vec<String>> {
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
            "crate" => Vec::new(),
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

/// The module graph of `src/`, from non-test code: an edge from each file's
/// module to the deepest module each of its paths names (itself excluded);
/// with `through_reexports`, looking through `pub use` re-exports to the
/// module that defines the item, else to the module that re-exports it.
fn module_graph(through_reexports: bool) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
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
                for path in paths_in(&format!("use {rest}"), &module, &children) {
                    if let Some(last) = path.last() {
                        reexports
                            .entry(module.clone())
                            .or_default()
                            .insert(last.clone(), path.clone());
                    }
                }
            }
        }
        uses.push((module.clone(), paths_in(&code, &module, &children)));
    }
    let resolve = |path: &[String]| -> Vec<String> {
        let mut path = path.to_vec();
        for _ in 0..8 {
            let n = (0..=path.len())
                .rev()
                .find(|n| modules.contains(&path[..*n]))
                .unwrap_or(0);
            let via = path
                .get(n)
                .and_then(|item| reexports.get(&path[..n])?.get(item));
            match via {
                Some(p) if through_reexports && *p != path => path = p.clone(),
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
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle between modules: {}", cycle.join(" -> "));
    }
}

/// A module that imports an item through a module that re-exports it
/// depends on that module too: `profile` taking `Answer` from `http`, which
/// imports `profile`, is a cycle a reader has to untangle.
#[test]
fn no_import_cycle_through_a_reexport() {
    let mut graph = module_graph(false);
    // The decision core names Consul's types through `crate::consul`, which
    // re-exports them beside the client that drives the core; its rewrite
    // names them where they are defined. Until then its imports are left out.
    for (module, edges) in graph.iter_mut() {
        if module == "decision" || module.starts_with("decision::") {
            edges.clear();
        }
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import cycle between modules, through a re-export: {}",
            cycle.join(" -> ")
        );
    }
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
    let lines: usize = files
        .iter()
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
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let over: Vec<String> = files
        .iter()
        .filter(|f| {
            let rel = f.strip_prefix(src()).unwrap();
            !OVER_BUDGET_FOR_NOW
                .iter()
                .any(|(dir, _)| rel.starts_with(dir))
                && !f.ends_with("tests.rs")
        })
        .filter_map(|f| {
            let lines = non_test_lines(&std::fs::read_to_string(f).unwrap()).len();
            let rel = f.strip_prefix(src()).unwrap().display();
            (lines > FILE_LINE_BUDGET).then(|| format!("src/{rel}: {lines}"))
        })
        .collect();
    assert!(
        over.is_empty(),
        "files over {FILE_LINE_BUDGET} lines outside #[cfg(test)] items (split them by concern): {}",
        over.join(", ")
    );
}
