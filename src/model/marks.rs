//! Drain marks: the Consul KV Flags a row key carries to say which `state
//! drain` wrote it (odd Flags, with the selection's FNV-1a id) or that it was
//! set by hand (even Flags). The FNV id is kept, not swapped for another
//! hash: its values are already in Consul.

/// The generic drain mark: Consul KV Flags 1. A row key written by `state
/// drain` carries [`drain_flags`] of its selection id, an odd value; any odd
/// value is a drain's mark, and 1 (selection id 0) is the mark every `state
/// undrain` releases, whatever its selection: `consul kv put -flags=1 KEY
/// maint` writes a key `state undrain` will release.
///
/// Even Flags mark a key set by hand, which both leave alone at drain, maint
/// or `0%`: 0 is what `consul kv put`, `state set` and `state canary
/// disable` write, and Consul's answer for a key written without Flags.
pub const DRAIN_FLAGS: u64 = 1;

/// The Consul KV Flags of a row key written by the drain (or undrain) whose
/// selection id is `id` (see [`selection_id`]): `1 | id << 1`. `state
/// undrain` with the same selection releases it; another selection's undrain
/// leaves it alone unless `--any-drain`.
pub fn drain_flags(id: u32) -> u64 {
    DRAIN_FLAGS | (u64::from(id) << 1)
}

/// Reads a drain mark from Consul KV Flags, the inverse of [`drain_flags`]:
/// the selection id for odd Flags (`Some(0)`: the generic mark, Flags 1),
/// `None` for even Flags (a key set by hand).
pub fn drain_mark(flags: u64) -> Option<u64> {
    (flags & DRAIN_FLAGS != 0).then_some(flags >> 1)
}

/// The stable id of a drain selection: FNV-1a (32 bits) of `zone=<Z>
/// backend=<B> server=<GLOB>`, absent parts empty. Where the servers are
/// read from (configuration or stats socket) is not part of it.
pub fn selection_id(zone: Option<&str>, backend: Option<&str>, server: Option<&str>) -> u32 {
    let text = format!(
        "zone={} backend={} server={}",
        zone.unwrap_or(""),
        backend.unwrap_or(""),
        server.unwrap_or("")
    );
    fnv1a_32(text.as_bytes())
}

/// FNV-1a, 32 bits, with its published offset basis and prime.
fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, b| {
        (hash ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_ids_are_fnv1a_of_the_normalized_selection() {
        // Published FNV-1a 32-bit test vectors.
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9c_f968);
        assert_eq!(
            selection_id(Some("b"), None, None),
            fnv1a_32(b"zone=b backend= server=")
        );
        assert_eq!(
            selection_id(None, Some("web"), Some("web-0*")),
            fnv1a_32(b"zone= backend=web server=web-0*")
        );
        assert_ne!(
            selection_id(Some("b"), None, None),
            selection_id(None, Some("b"), None)
        );
    }
}
