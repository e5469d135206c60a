//! A vector kept in fixed-size chunks shared behind reference counts, and a
//! min-heap on it: the table's large collections (key slots, free slots,
//! the deadline heaps) copied in microseconds for a snapshot.
//!
//! A copy of a [`Chunks`] copies one pointer per chunk; the first write to a
//! chunk that a copy still shares copies that chunk alone (copy on write,
//! `Arc::make_mut`). So a snapshot takes the table as it stands under the
//! lock without copying a key, encodes it after the lock is released, and
//! the writes that go on meanwhile copy only the chunks they touch, once.

use std::ops::{Index, IndexMut};
use std::sync::Arc;

/// Elements per chunk, as a power of two. 1,024 key slots are 80 KiB, which
/// the first write to a chunk after a snapshot copies (tens of µs); a table
/// of 1,000,000 keys is about 1,000 chunks, whose pointers a snapshot copies.
const CHUNK_BITS: u32 = 10;
const CHUNK: usize = 1 << CHUNK_BITS;
const MASK: usize = CHUNK - 1;

/// A vector in shared chunks; see the module documentation. Every chunk but
/// the last is full, so element `i` is in chunk `i / CHUNK`.
#[derive(Debug)]
pub struct Chunks<T> {
    chunks: Vec<Arc<Vec<T>>>,
    len: usize,
}

impl<T> Default for Chunks<T> {
    fn default() -> Self {
        Chunks {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

/// A copy that shares every chunk: a pointer per chunk, whatever `T` is.
impl<T> Clone for Chunks<T> {
    fn clone(&self) -> Self {
        Chunks {
            chunks: self.chunks.clone(),
            len: self.len,
        }
    }
}

impl<T> Chunks<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<&T> {
        self.chunks
            .get(i >> CHUNK_BITS)
            .and_then(|c| c.get(i & MASK))
    }

    /// Every element, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &T> + '_ {
        Iter {
            inner: self.chunks.iter().flat_map(|c| c.iter()),
            left: self.len,
        }
    }

    /// Elements `from..to` (as far as there are), in order, without a walk
    /// over the ones before `from`.
    pub fn range(&self, from: usize, to: usize) -> impl Iterator<Item = &T> + '_ {
        let to = to.min(self.len);
        let from = from.min(to);
        self.chunks[from >> CHUNK_BITS..]
            .iter()
            .flat_map(|c| c.iter())
            .skip(from & MASK)
            .take(to - from)
    }
}

impl<T: Clone> Chunks<T> {
    /// Element `i`, mutably; copies its chunk first if a copy shares it.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        let chunk = self.chunks.get_mut(i >> CHUNK_BITS)?;
        Arc::make_mut(chunk).get_mut(i & MASK)
    }

    /// Appends `x`.
    pub fn push(&mut self, x: T) {
        if self.len & MASK == 0 {
            // Empty, to grow as a vector does: a table of a few keys, which
            // may empty and refill on every Lock, keeps small allocations.
            self.chunks.push(Arc::new(Vec::new()));
        }
        if let Some(last) = self.chunks.last_mut() {
            let last = Arc::make_mut(last);
            if last.len() == last.capacity() {
                // Doubling, never past a chunk (a chunk copied on write
                // has only its length's room, which doubling would pass).
                last.reserve_exact(last.len().max(4).min(CHUNK - last.len()));
            }
            last.push(x);
            self.len += 1;
        }
    }

    /// Removes and returns the last element.
    pub fn pop(&mut self) -> Option<T> {
        let last = self.chunks.last_mut()?;
        let x = Arc::make_mut(last).pop();
        if last.is_empty() {
            self.chunks.pop();
        }
        if x.is_some() {
            self.len -= 1;
        }
        x
    }
}

impl<T> Index<usize> for Chunks<T> {
    type Output = T;

    /// Element `i`; panics past the end, as a slice does.
    fn index(&self, i: usize) -> &T {
        &self.chunks[i >> CHUNK_BITS][i & MASK]
    }
}

impl<T: Clone> IndexMut<usize> for Chunks<T> {
    /// Element `i`, mutably (see [`Chunks::get_mut`]); panics past the end,
    /// as a slice does.
    fn index_mut(&mut self, i: usize) -> &mut T {
        &mut Arc::make_mut(&mut self.chunks[i >> CHUNK_BITS])[i & MASK]
    }
}

impl<T: Clone> FromIterator<T> for Chunks<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut c = Chunks::default();
        for x in iter {
            c.push(x);
        }
        c
    }
}

/// [`Chunks::iter`]: its length is known, so a snapshot writes it as a
/// sequence of known length.
struct Iter<I> {
    inner: I,
    left: usize,
}

impl<I: Iterator> Iterator for Iter<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        let x = self.inner.next()?;
        self.left -= 1;
        Some(x)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<I: Iterator> ExactSizeIterator for Iter<I> {}

/// A min-heap on [`Chunks`]: what `BinaryHeap<Reverse<T>>` does for the
/// table, copied for a snapshot as cheaply as [`Chunks`]. The least element
/// comes out first; equal elements are indistinguishable, so the order in
/// which elements come out depends only on which elements are in it.
#[derive(Debug)]
pub struct Heap<T> {
    items: Chunks<T>,
}

impl<T> Default for Heap<T> {
    fn default() -> Self {
        Heap {
            items: Chunks::default(),
        }
    }
}

/// A copy that shares every chunk (see [`Chunks`]).
impl<T> Clone for Heap<T> {
    fn clone(&self) -> Self {
        Heap {
            items: self.items.clone(),
        }
    }
}

impl<T> Heap<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// The least element.
    pub fn peek(&self) -> Option<&T> {
        self.items.get(0)
    }

    /// Every element, in the heap's own order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &T> + '_ {
        self.items.iter()
    }

    /// Removes every element.
    pub fn clear(&mut self) {
        self.items = Chunks::default();
    }
}

impl<T: Ord + Copy> Heap<T> {
    /// Adds `x`.
    pub fn push(&mut self, x: T) {
        self.items.push(x);
        self.sift_up(self.items.len() - 1);
    }

    /// Removes and returns the least element.
    pub fn pop(&mut self) -> Option<T> {
        let last = self.items.pop()?;
        if self.items.is_empty() {
            return Some(last);
        }
        let least = std::mem::replace(&mut self.items[0], last);
        self.sift_down(0);
        Some(least)
    }

    /// Keeps only the elements `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let kept: Chunks<T> = self.items.iter().filter(|x| keep(x)).copied().collect();
        *self = Heap::from_chunks(kept);
    }

    /// Moves the element at `i` up to where it belongs.
    fn sift_up(&mut self, mut i: usize) {
        let x = self.items[i];
        while i > 0 {
            let parent = (i - 1) / 2;
            let p = self.items[parent];
            if p <= x {
                break;
            }
            self.items[i] = p;
            i = parent;
        }
        self.items[i] = x;
    }

    /// Moves the element at `i` down to where it belongs.
    fn sift_down(&mut self, mut i: usize) {
        let len = self.items.len();
        let x = self.items[i];
        loop {
            let left = 2 * i + 1;
            if left >= len {
                break;
            }
            let right = left + 1;
            let child = if right < len && self.items[right] < self.items[left] {
                right
            } else {
                left
            };
            let c = self.items[child];
            if x <= c {
                break;
            }
            self.items[i] = c;
            i = child;
        }
        self.items[i] = x;
    }

    /// A heap of `items`, in any order.
    fn from_chunks(items: Chunks<T>) -> Self {
        let mut heap = Heap { items };
        for i in (0..heap.items.len() / 2).rev() {
            heap.sift_down(i);
        }
        heap
    }
}

impl<T: Ord + Copy> FromIterator<T> for Heap<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Heap::from_chunks(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_copy_keeps_what_it_was_while_the_original_is_written() {
        let mut a: Chunks<u32> = (0..3000).collect();
        let copy = a.clone();
        a[5] = 99;
        a[2500] = 98;
        a.push(3000);
        assert_eq!(a.pop(), Some(3000));
        assert_eq!(a.pop(), Some(2999));
        assert_eq!(copy.len(), 3000);
        assert!(copy.iter().copied().eq(0..3000), "the copy is untouched");
        assert_eq!((a[5], a[2500], a.len()), (99, 98, 2999));
        // Only the chunks written were copied.
        assert!(Arc::ptr_eq(&a.chunks[1], &copy.chunks[1]));
        assert!(!Arc::ptr_eq(&a.chunks[0], &copy.chunks[0]));
    }

    #[test]
    fn a_chunk_never_holds_room_past_its_size() {
        let mut a: Chunks<u8> = (0..1500).map(|i| i as u8).collect();
        assert_eq!(a.chunks[0].capacity(), CHUNK, "doubling stops at a chunk");
        let copy = a.clone();
        for i in 0..600 {
            a.push(i as u8);
        }
        assert_eq!(a.chunks[1].capacity(), CHUNK, "a copied chunk too");
        assert_eq!((a.len(), copy.len()), (2100, 1500));
    }

    #[test]
    fn ranges_start_anywhere_and_stop_at_the_end() {
        let a: Chunks<usize> = (0..2500).collect();
        assert!(a.range(1000, 1030).copied().eq(1000..1030));
        assert!(a.range(2040, 9999).copied().eq(2040..2500));
        assert_eq!(a.range(3000, 4000).count(), 0);
        assert_eq!(a.iter().len(), 2500);
    }

    proptest! {
        /// The heap gives out what `BinaryHeap<Reverse<_>>` would, in the
        /// same order, through pushes, pops and retains, and a copy taken
        /// midway keeps its elements.
        #[test]
        fn the_heap_pops_as_a_binary_heap_does(
            ops in prop::collection::vec((0u8..4, 0u16..500), 0..3000)
        ) {
            use std::cmp::Reverse;
            use std::collections::BinaryHeap;
            let mut ours: Heap<u16> = Heap::default();
            let mut std: BinaryHeap<Reverse<u16>> = BinaryHeap::new();
            let mut copy = None;
            for (i, (op, x)) in ops.into_iter().enumerate() {
                match op {
                    0 | 1 => {
                        ours.push(x);
                        std.push(Reverse(x));
                    }
                    2 => prop_assert_eq!(ours.pop(), std.pop().map(|Reverse(x)| x)),
                    _ => {
                        ours.retain(|y| y % 7 != x % 7);
                        std.retain(|Reverse(y)| y % 7 != x % 7);
                    }
                }
                prop_assert_eq!(ours.len(), std.len());
                prop_assert_eq!(ours.peek(), std.peek().map(|Reverse(x)| x));
                if i == 1000 {
                    let mut sorted: Vec<u16> = ours.iter().copied().collect();
                    sorted.sort_unstable();
                    copy = Some((ours.clone(), sorted));
                }
            }
            if let Some((copy, sorted)) = copy {
                let mut now: Vec<u16> = copy.iter().copied().collect();
                now.sort_unstable();
                prop_assert_eq!(now, sorted);
            }
        }
    }
}
