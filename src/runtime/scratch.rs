//! Stream-ordered scratch memory of one op call: allocated on the call's stream
//! (`cuMemAllocAsync`, graph-capturable, no host synchronisation) and freed on the same stream
//! after the launches that use it, on every path.

use crate::error::Result;
use crate::runtime::driver::{self, ScratchPool, Stream};

/// The scratch buffers of one call on one stream. `free` releases them once the launches are
/// queued and reports a failed free; on an early return (an error before `free`) dropping the
/// guard releases them, quietly (the call already fails with the first error).
///
/// The device's context must be current wherever the guard allocates, frees or is dropped
/// (ops hold `DeviceCtx::bind`'s guard for the whole call: declare it before this one). Made
/// by `DeviceCtx::scratch`, which passes the device's scratch pool.
pub struct StreamScratch {
    ptrs: Vec<u64>,
    stream: Stream,
    pool: Option<ScratchPool>,
}

impl StreamScratch {
    pub fn new(stream: Stream, pool: Option<ScratchPool>) -> StreamScratch {
        StreamScratch {
            ptrs: Vec::new(),
            stream,
            pool,
        }
    }

    /// A new buffer of `bytes` bytes (at least one), usable by work queued on the stream
    /// after this call and until `free`.
    pub fn alloc(&mut self, bytes: usize) -> Result<u64> {
        let p = driver::alloc_async(bytes, self.stream, self.pool)?;
        self.ptrs.push(p);
        Ok(p)
    }

    /// Frees every buffer, ordered after the work queued on the stream so far; every buffer
    /// is freed even when one fails, and the first failure is returned.
    pub fn free(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        let mut first = Ok(());
        for p in self.ptrs.drain(..) {
            // SAFETY: each pointer came from alloc_async on this stream, and `drain` hands it
            // out once; only work queued on this stream (before this point) uses it.
            let r = unsafe { driver::free_async(p, self.stream) };
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for StreamScratch {
    fn drop(&mut self) {
        // after `free` nothing is left; else an error path: its error is the one reported
        let _ = self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_scratch_frees_without_the_driver() {
        // no buffer: neither free nor drop calls cuMemFreeAsync (no GPU here)
        let s = StreamScratch::new(Stream::from_raw(0), None);
        assert!(s.free().is_ok());
        drop(StreamScratch::new(Stream::from_raw(0), None));
    }
}
