//! The on-disk CUBIN cache. An entry's file name is the hash of everything that decides its
//! bytes (source with prelude, NVRTC options, NVRTC version, arch); its content is a magic tag,
//! the SHA-256 of the payload and the payload, so a truncated or corrupt file is detected and
//! recompiled rather than handed to the driver. Writes go to a temp file that is renamed into
//! place, so concurrent processes never see half an entry. Cache I/O errors are never fatal.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"FSCUBIN1";

pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FLASHSCAN_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Path::new(&d).join("flashscan");
    }
    match std::env::var_os("HOME") {
        Some(h) => Path::new(&h).join(".cache").join("flashscan"),
        None => std::env::temp_dir().join("flashscan-cache"),
    }
}

/// The cache key: hex SHA-256 over every input that decides the CUBIN.
pub fn key(source: &str, options: &[String], nvrtc_version: (i32, i32), arch: &str) -> String {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    for o in options {
        h.update([0u8]);
        h.update(o.as_bytes());
    }
    h.update(format!("\0nvrtc {}.{}\0{arch}", nvrtc_version.0, nvrtc_version.1).as_bytes());
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub struct DiskCache {
    pub dir: PathBuf,
}

impl DiskCache {
    pub fn new(dir: PathBuf) -> DiskCache {
        DiskCache { dir }
    }

    fn path(&self, label: &str, key: &str) -> PathBuf {
        self.dir.join(format!("{label}-{}.cubin", &key[..24]))
    }

    /// The cached CUBIN if present and intact.
    pub fn load(&self, label: &str, key: &str) -> Option<Vec<u8>> {
        let data = std::fs::read(self.path(label, key)).ok()?;
        if data.len() < 40 || &data[..8] != MAGIC {
            return None;
        }
        let (digest, payload) = data[8..].split_at(32);
        if Sha256::digest(payload).as_slice() != digest {
            return None;
        }
        Some(payload.to_vec())
    }

    /// Stores a CUBIN atomically; returns false (silently) when the cache dir is unwritable.
    pub fn store(&self, label: &str, key: &str, cubin: &[u8]) -> bool {
        self.try_store(label, key, cubin).is_ok()
    }

    fn try_store(&self, label: &str, key: &str, cubin: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let final_path = self.path(label, key);
        let tmp = self.dir.join(format!(
            ".{label}-{}.{}.{:?}.tmp",
            &key[..24],
            std::process::id(),
            std::thread::current().id()
        ));
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(MAGIC)?;
            f.write_all(&Sha256::digest(cubin))?;
            f.write_all(cubin)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &final_path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_cache(name: &str) -> DiskCache {
        let dir =
            std::env::temp_dir().join(format!("flashscan-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        DiskCache::new(dir)
    }

    #[test]
    fn round_trip_and_corruption() {
        let c = temp_cache("rt");
        let k = key("src", &["--a".into()], (13, 0), "sm_90a");
        assert!(c.load("fam", &k).is_none());
        assert!(c.store("fam", &k, b"cubin bytes"));
        assert_eq!(c.load("fam", &k).as_deref(), Some(&b"cubin bytes"[..]));
        // Flip one payload byte: the entry must be rejected, not trusted.
        let p = c.path("fam", &k);
        let mut data = std::fs::read(&p).unwrap();
        let last = data.len() - 1;
        data[last] ^= 0xff;
        std::fs::write(&p, &data).unwrap();
        assert!(c.load("fam", &k).is_none());
        // Truncated.
        std::fs::write(&p, &data[..20]).unwrap();
        assert!(c.load("fam", &k).is_none());
        let _ = std::fs::remove_dir_all(&c.dir);
    }

    #[test]
    fn key_depends_on_every_input() {
        let base = key("s", &["-o".into()], (13, 0), "sm_90a");
        assert_ne!(base, key("t", &["-o".into()], (13, 0), "sm_90a"));
        assert_ne!(base, key("s", &["-p".into()], (13, 0), "sm_90a"));
        assert_ne!(base, key("s", &["-o".into()], (13, 1), "sm_90a"));
        assert_ne!(base, key("s", &["-o".into()], (13, 0), "sm_80"));
    }
}
