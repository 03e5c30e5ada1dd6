//! The hot path never allocates: a counting global allocator proves it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use hoptrace_probe::LocalQueue;
use hoptrace_probe::carrier::envelope;
use hoptrace_probe::context::MAX_TEXT_LEN;
use hoptrace_probe::{HopId, TraceContext, TraceKey};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
}

#[test]
fn stamp_report_record_and_decoding_allocate_nothing() {
    let q = LocalQueue::new(1 << 16);
    let p = q.probe(HopId(2));
    let base = TraceContext::new(
        TraceKey {
            publisher: 1,
            stream: 2,
            sequence: 3,
        },
        4,
        5,
    );
    let bin = {
        let mut c = base;
        p.stamp(&mut c);
        c.to_bytes()
    };
    let text = TraceContext::decode(&bin).unwrap().to_text();
    let msg = envelope::wrap(&TraceContext::decode(&bin).unwrap(), b"payload");
    let mut text_buf = [0u8; MAX_TEXT_LEN];

    let n = allocations_in(|| {
        for i in 0..10_000 {
            let mut c = base;
            c.key.sequence = i;
            p.stamp(&mut c);
            assert!(p.report_stamp(&c, 1).queued);
            assert!(p.record(&mut c).queued);
            assert!(p.record_at(&mut c, 2).queued);
            std::hint::black_box(c.encode());
            std::hint::black_box(c.encode_text(&mut text_buf).len());
            std::hint::black_box(TraceContext::decode(&bin).unwrap());
            std::hint::black_box(TraceContext::decode_text(&text).unwrap());
            std::hint::black_box(envelope::unwrap(&msg).unwrap());
        }
    });
    assert_eq!(n, 0, "the hot path allocated {n} times");
    assert_eq!(q.len(), 30_000);
    // A full queue drops and counts, still without allocating.
    let full = LocalQueue::new(1);
    let fp = full.probe(HopId(0));
    let n = allocations_in(|| {
        for _ in 0..100 {
            let mut c = base;
            fp.record(&mut c);
        }
    });
    assert_eq!(n, 0);
    assert_eq!(full.counters().queue_full, 99);
}
