//! Content revisions: a stable hash of a spec's JSON form.

use serde::Serialize;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A 16-hex-digit FNV-1a hash of `value`'s JSON serialisation.
///
/// The same content always gives the same revision, across processes and restarts, so
/// a restarted controller recognises what it wrote before and writes nothing.
#[must_use]
pub fn revision_of<T: Serialize>(value: &T) -> String {
    let mut hasher = Fnv1a(FNV_OFFSET);
    // Serialising plain data into an in-memory writer only fails for maps with non-string
    // keys, which no proxyplan type has; hash the error text in that case so the result
    // still differs from any valid content.
    if let Err(err) = serde_json::to_writer(&mut hasher, value) {
        hasher.update(err.to_string().as_bytes());
    }
    format!("{:016x}", hasher.0)
}

/// FNV-1a 64 of `bytes`: a hash that never changes between builds, for spreading
/// objects over shards.
#[must_use]
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut hasher = Fnv1a(FNV_OFFSET);
    hasher.update(bytes);
    hasher.0
}

struct Fnv1a(u64);

impl Fnv1a {
    fn update(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }
}

impl std::io::Write for Fnv1a {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // FNV-1a 64 of the JSON text `"a"` (three bytes: quote, a, quote).
        let mut h = Fnv1a(FNV_OFFSET);
        h.update(b"\"a\"");
        assert_eq!(revision_of(&"a"), format!("{:016x}", h.0));
        // FNV-1a 64 of the empty input is the offset basis.
        assert_eq!(Fnv1a(FNV_OFFSET).0, 0xcbf2_9ce4_8422_2325);
        // FNV-1a 64 of "a" is a published test vector.
        let mut a = Fnv1a(FNV_OFFSET);
        a.update(b"a");
        assert_eq!(a.0, 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn content_changes_revision() {
        assert_ne!(revision_of(&vec![1, 2]), revision_of(&vec![2, 1]));
        assert_eq!(revision_of(&vec![1, 2]), revision_of(&vec![1, 2]));
    }
}
