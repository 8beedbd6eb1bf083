//! What every benchmark records beside its figures: the machine and the
//! build they were measured on, and the section of BENCHMARKS.md they go in.

use std::path::Path;
use std::process::Command;

/// The first line a command prints (stdout, else stderr); empty if it
/// cannot run.
pub fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

/// CPU, memory, kernel, Consul and HAProxy versions, the agent's commit
/// and the date, as a Markdown list.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")?
                    .split_once(':')
                    .map(|(_, v)| v.trim().to_string())
            })
        })
        .unwrap_or_default();
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let commit = command_line(
        "git",
        &[
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short",
            "HEAD",
        ],
    );
    let dirty = command_line(
        "git",
        &[
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "status",
            "--porcelain",
            "--untracked-files=no",
        ],
    );
    let tree = if dirty.is_empty() {
        format!("commit {commit}")
    } else {
        format!("commit {commit} with uncommitted changes in the working tree")
    };
    format!(
        "- CPU: {cpu}, {nproc} cores (nproc)\n- memory: {:.1} GiB\n- kernel: {}\n- {}\n- {}\n- agent: release build of {tree}\n- date: {}\n",
        mem_kib as f64 / 1024.0 / 1024.0,
        kernel.trim(),
        command_line("consul", &["version"]),
        command_line("haproxy", &["-v"]),
        command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
    )
}

/// Replaces the text between `begin` and `end` in BENCHMARKS.md.
pub fn record(begin: &str, end: &str, body: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("BENCHMARKS.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n".into());
    let block = format!("{begin}\n{body}{end}");
    let new = match (text.find(begin), text.find(end)) {
        (Some(b), Some(e)) if e > b => format!("{}{block}{}", &text[..b], &text[e + end.len()..]),
        _ => format!("{}\n{block}\n", text.trim_end()),
    };
    std::fs::write(&path, new).expect("write BENCHMARKS.md");
    eprintln!("recorded in {}", path.display());
}
