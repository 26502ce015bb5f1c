//! Work counters of persistent kernels that leave them zeroed when they finish (the last CTA
//! out resets them): one 8-byte pair per stream of a device, so that a launch needs no memset
//! and no allocation. Launches on one stream run one after another, so they can share a pair;
//! launches on two streams may overlap, so each stream has its own. Where a pair could be
//! shared by overlapping launches (under graph capture: a captured pointer replays on any
//! stream; the per-thread default stream: one handle, a stream per thread) or the table is
//! full, there is none: the caller then allocates and zeroes scratch for the call.
//!
//! A stream's first queue launch allocates its pair stream-ordered (cuMemAllocAsync from the
//! device's default pool, never freed): unlike cuMemAlloc, CUDA allows it while another thread
//! captures a graph in global mode.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::runtime::driver::{self, Stream};

/// Streams a device keeps a pair for (8 bytes each, never freed: a stream handle freed and
/// made again reuses its pair, which its last launch left zeroed; a pair allocated on a stream
/// since destroyed stays valid, as stream-ordered memory outlives its stream).
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
        // Stream-ordered (from the default pool, never freed): unlike cuMemAlloc it does not
        // break another thread's global-mode graph capture. Only this stream uses the pair.
        let p = driver::alloc_async(8, stream, None)?;
        // SAFETY: p is a fresh 8-byte allocation ordered on `stream`, zeroed on it before any
        // kernel using it is launched there.
        if let Err(e) = unsafe { driver::zero_async(p, 8, stream) } {
            // SAFETY: p came from alloc_async on this stream; nothing else uses it.
            let _ = unsafe { driver::free_async(p, stream) };
            return Err(e);
        }
        map.insert(handle, p);
        Ok(Some(p))
    }
}
