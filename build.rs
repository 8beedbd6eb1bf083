//! Generates the manual pages (clap_mangen) and the bash, zsh and fish
//! completions (clap_complete) from the clap definitions in `src/cli.rs`,
//! which the package installs (`[package.metadata.deb]` assets).
//!
//! They are written to `<profile dir>/assets/` (e.g. `target/release/
//! assets/`), the folder cargo-deb resolves `target/release/` asset paths
//! to, whatever `CARGO_TARGET_DIR` is; `$OUT_DIR` holds a hash cargo-deb
//! cannot name. `src/cli.rs` and `src/cli/` are compiled here as they are,
//! so they may use only std, clap, humantime and thiserror.

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use clap::CommandFactory as _;
use clap_complete::Shell;

#[path = "src"]
#[allow(dead_code, unused_imports, clippy::all)]
mod source {
    pub mod cli;
}

/// The binary's name: the man page's and the completions'.
const BIN: &str = "gitlab-haproxy-agent";

/// The manual the pages belong to, centred in their header line.
const MANUAL: &str = "gitlab-haproxy-agent Manual";

/// The width `man` formats for on an 80-column terminal; a header line
/// wider than that runs its three parts together (groff 1.22).
const HEADER_WIDTH: usize = 80;

fn main() -> io::Result<()> {
    println!("cargo::rerun-if-changed=src/cli.rs");
    println!("cargo::rerun-if-changed=src/cli");
    println!("cargo::rerun-if-changed=Cargo.toml");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is <profile dir>/build/<package>-<hash>/out.
    let profile_dir = out_dir
        .ancestors()
        .nth(3)
        .expect("OUT_DIR is <profile dir>/build/<package>-<hash>/out");
    let assets = profile_dir.join("assets");
    write_assets(&assets)
}

/// Writes `man/*.1.gz` (the daemon's page and one per subcommand, e.g.
/// `gitlab-haproxy-agent-state-drain.1`) and `completions/` under `dir`,
/// replacing what an earlier build left there.
fn write_assets(dir: &Path) -> io::Result<()> {
    let man = dir.join("man");
    let completions = dir.join("completions");
    for d in [&man, &completions] {
        match fs::remove_dir_all(d) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => fs::create_dir_all(d)?,
        }
    }
    let cmd = source::cli::Cli::command();
    write_pages(cmd.clone(), &man)?;
    // Gzipped here, at the highest level, as Debian policy 12.1 wants:
    // cargo-deb does not compress what it takes from the target folder.
    for entry in fs::read_dir(&man)? {
        let page = entry?.path();
        let mut gz = flate2::write::GzEncoder::new(
            fs::File::create(page.with_extension("1.gz"))?,
            flate2::Compression::best(),
        );
        gz.write_all(&fs::read(&page)?)?;
        gz.finish()?;
        fs::remove_file(&page)?;
    }
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut cmd.clone(), BIN, &completions)?;
        if shell == Shell::Bash {
            fs::write(&path, bash_arms_fixed(&fs::read_to_string(&path)?))?;
        }
    }
    Ok(())
}

/// Writes the page of `cmd` and of each of its subcommands under `dir`, as
/// `clap_mangen::generate_to` does, with a header line that reads apart:
/// `TITLE(1)  MANUAL  TITLE(1)` and the footer `gitlab-haproxy-agent
/// VERSION` (clap_mangen's defaults give a subcommand's page the source
/// `drain ` and groff's "General Commands Manual", which a long title
/// overruns). A page whose title leaves no room for [`MANUAL`] within
/// [`HEADER_WIDTH`] gets a blank middle.
fn write_pages(cmd: clap::Command, dir: &Path) -> io::Result<()> {
    fn write(cmd: clap::Command, dir: &Path, source: &str) -> io::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            write(sub, dir, source)?;
        }
        let title = cmd
            .get_display_name()
            .unwrap_or_else(|| cmd.get_name())
            .to_uppercase();
        // `TITLE(1)` on both sides, two spaces at least each side of the middle.
        let manual = if 2 * (title.len() + 3) + MANUAL.len() + 4 <= HEADER_WIDTH {
            MANUAL
        } else {
            " "
        };
        clap_mangen::Man::new(cmd)
            .title(title)
            .section("1")
            // No date (the build stays reproducible), but its place kept:
            // roff writes an empty argument as nothing, which shifted the
            // source into the date's place and left the manual to groff.
            .date("\"\"")
            .source(source)
            .manual(manual)
            .generate_to(dir)?;
        Ok(())
    }
    let source = format!("{BIN} {}", env!("CARGO_PKG_VERSION"));
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    write(cmd, dir, &source)
}

/// The bash script with its `case "${cmd}"` arms spelled as its loop
/// spells `cmd`. clap_complete (4.6.12) escapes the hyphens of a bin name
/// with `__subcmd__` in the arms and `__` in the loop, so past the first
/// word no arm matches and `gitlab-haproxy-agent state dr<TAB>` completes
/// nothing (clap-rs/clap#6421). A no-op once clap_complete spells both
/// alike; the package test completes `state dr` to `drain`.
fn bash_arms_fixed(script: &str) -> String {
    let loop_name = BIN.replace('-', "__");
    let arm_name = BIN.replace('-', "__subcmd__");
    script.replace(&arm_name, &loop_name)
}
