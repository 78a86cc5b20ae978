//! A global allocator that counts live heap bytes (a benchmark declares it with
//! `#[global_allocator] static ALLOC: common::alloc::CountingAlloc = common::alloc::CountingAlloc;`),
//! so a figure is what is held now, not the allocator's high-water mark that RSS shows.

pub struct CountingAlloc;

static LIVE_HEAP: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE_HEAP.fetch_add(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        std::alloc::System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE_HEAP.fetch_sub(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        std::alloc::System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        LIVE_HEAP.fetch_add(
            new_size as isize - layout.size() as isize,
            std::sync::atomic::Ordering::Relaxed,
        );
        std::alloc::System.realloc(ptr, layout, new_size)
    }
}

pub fn live_heap() -> i64 {
    LIVE_HEAP.load(std::sync::atomic::Ordering::Relaxed) as i64
}
