//! Work counters of persistent kernels that leave them zeroed when they finish (the last CTA
//! out resets them): one 8-byte pair per stream of a device, so that a launch needs no memset
//! and no allocation. Launches on one stream run one after another, so they can share a pair;
//! launches on two streams may overlap, so each stream has its own. Where a pair could be
//! shared by overlapping launches (under graph capture: a captured pointer replays on any
//! stream; the per-thread default stream: one handle, a stream per thread) or the table is
//! full, there is none: the caller then allocates and zeroes scratch for the call.
//!
//! Known limit: a stream's first queue launch allocates its pair with cuMemAlloc, which CUDA
//! refuses (and which invalidates that capture) while another thread captures a graph in global
//! mode; a stream-ordered allocation would not, and is the next change (untested on a GPU yet).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::runtime::driver::{self, Stream};

/// Streams a device keeps a pair for (8 bytes each, never freed: a stream handle freed and
/// made again reuses its pair, which its last launch left zeroed).
const MAX_STREAMS: usize = 4096;
/// `CU_STREAM_PER_THREAD`: one handle naming a different stream in each host thread.
const PER_THREAD_STREAM: u64 = 0x2;

#[derive(Default)]
pub struct StreamCounters(Mutex<HashMap<u64, u64>>);

impl StreamCounters {
    /// A zeroed pair of i32 counters (device pointer) for a kernel launched next on `stream`,
    /// which must leave them zeroed; None where one may not be shared (see the module doc).
    /// The device's context must be current; a new pair is zeroed on `stream`.
    pub fn get(&self, stream: Stream) -> Result<Option<u64>> {
        let handle = stream.0 as usize as u64;
        if handle == PER_THREAD_STREAM || driver::is_capturing(stream).unwrap_or(true) {
            return Ok(None);
        }
        let mut map = self
            .0
            .lock()
            .map_err(|_| Error::Internal("stream counters lock poisoned".into()))?;
        if let Some(p) = map.get(&handle) {
            return Ok(Some(*p));
        }
        if map.len() >= MAX_STREAMS {
            return Ok(None);
        }
        let p = driver::alloc(8)?;
        // SAFETY: p is a fresh 8-byte allocation, never freed; zeroed on the stream the
        // kernel using it will be launched on, so ordered before that launch.
        if let Err(e) = unsafe { driver::zero_async(p, 8, stream) } {
            // SAFETY: p came from alloc above and nothing was queued on it.
            let _ = unsafe { driver::free(p) };
            return Err(e);
        }
        map.insert(handle, p);
        Ok(Some(p))
    }
}
