//! Drain marks: the Consul KV Flags of a row key say whether `state drain`
//! wrote it (odd Flags) or someone set it by hand (even Flags, 0 being what
//! `consul kv put` and `state set` write). Group keys (`canary`, `zone-b`)
//! have no mark: whoever undrains the group brings it back.

/// The drain mark `state drain` writes on row keys: Consul KV Flags 1.
///
/// Any odd value is read as a drain's mark, so keys written by earlier
/// versions (`1 | selection id << 1`) are released by any `state undrain`
/// whose selection includes them. `consul kv put -flags=1 KEY maint` writes a
/// key `state undrain` will release. Even Flags mark a key set by hand, which
/// `state drain` and `state undrain` leave alone at drain, maint or `0%`.
pub const DRAIN_FLAGS: u64 = 1;

/// True when Consul KV Flags carry a drain mark (odd), false for a key set
/// by hand (even).
pub fn is_drain_mark(flags: u64) -> bool {
    flags & DRAIN_FLAGS != 0
}

/// What a row key's Flags say: `drain` for the drain mark (odd Flags; an
/// earlier version's larger odd value shown with it), `hand` for even Flags
/// (with them when they are not 0). The writer's SET-BY column.
pub fn mark_name(flags: u64) -> String {
    match (is_drain_mark(flags), flags) {
        (true, 1) => "drain".to_string(),
        (true, _) => format!("drain (flags {flags})"),
        (false, 0) => "hand".to_string(),
        (false, _) => format!("hand (flags {flags})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_flags_are_a_drain_mark_even_flags_a_hand() {
        for flags in [1, 3, 0x1234_5679, u64::MAX] {
            assert!(is_drain_mark(flags), "{flags}");
        }
        for flags in [0, 2, 42, u64::MAX - 1] {
            assert!(!is_drain_mark(flags), "{flags}");
        }
    }
}
