//! Plain-text tables for people (`--json` callers get serde_json values),
//! and the line printers every command writes through.

use std::io::Write as _;

/// Renders rows under a header, columns padded to their widest cell, two
/// spaces apart, no trailing blanks.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let columns = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 < cells.len() {
                text.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            } else {
                text.push_str(cell);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// A report printed as text for people or, with `--json`, as the JSON of
/// its fields: the text is rendered from the same value, so the two agree.
pub trait Render: serde::Serialize {
    /// The text, each line ending in a newline.
    fn text(&self) -> String;
}

/// Prints a line on stdout, ignoring write errors: after SIGHUP the terminal
/// may be gone, and the exit status must still say what happened (`println!`
/// would panic instead).
pub fn out_line(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
    let _ = stdout.flush();
}

/// Like [`out_line`], on stderr.
pub fn err_line(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up() {
        let t = table(
            &["KEY", "VALUE"],
            &[
                vec!["canary".into(), "drain".into()],
                vec!["web/web-01".into(), "".into()],
            ],
        );
        assert_eq!(t, "KEY         VALUE\ncanary      drain\nweb/web-01\n");
    }
}
