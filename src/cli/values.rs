//! Parsers of option values shared by the daemon's and the writer's
//! options.

use std::time::Duration;

/// A duration option's value (humantime: `500ms`, `60s`, `2m`, `1h30m`).
///
/// # Errors
///
/// A message naming the value and the form expected, which clap prints
/// with the option (exit 64).
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value).map_err(|e| {
        format!("`{value}` is not a duration ({e}): write a number and a unit, e.g. 500ms, 60s, 2m, 1h30m")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_duration_names_the_value_and_the_form_expected() {
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        let e = parse_duration("abc").unwrap_err();
        assert!(
            e.starts_with("`abc` is not a duration") && e.contains("60s"),
            "{e}"
        );
    }
}
