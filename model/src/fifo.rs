//! `Fifo`: a small vector of fixed capacity, stored inline (the states' queues, messages, calls).

/// A small vector of fixed capacity, stored inline (a state is cloned at every step: no
/// allocation). Unused slots stay `T::default()`; `Eq`, `Ord` (the length first, then the
/// items, as derived) and `Hash` look at the items only.
#[derive(Clone, Copy, Debug)]
pub struct Fifo<T: Copy + Default, const N: usize> {
    len: u8,
    items: [T; N],
}

impl<T: Copy + Default + PartialEq, const N: usize> PartialEq for Fifo<T, N> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Copy + Default + Eq, const N: usize> Eq for Fifo<T, N> {}

impl<T: Copy + Default + Ord, const N: usize> PartialOrd for Fifo<T, N> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<T: Copy + Default + Ord, const N: usize> Ord for Fifo<T, N> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.len
            .cmp(&other.len)
            .then_with(|| (**self).cmp(&**other))
    }
}

impl<T: Copy + Default + std::hash::Hash, const N: usize> std::hash::Hash for Fifo<T, N> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (**self).hash(h)
    }
}

impl<T: Copy + Default, const N: usize> Default for Fifo<T, N> {
    fn default() -> Self {
        Fifo {
            len: 0,
            items: [T::default(); N],
        }
    }
}

impl<T: Copy + Default, const N: usize> Fifo<T, N> {
    pub fn push(&mut self, x: T) {
        assert!((self.len as usize) < N, "model capacity {N} exceeded");
        self.items[self.len as usize] = x;
        self.len += 1;
    }
    pub fn remove(&mut self, i: usize) -> T {
        let n = self.len as usize;
        assert!(i < n);
        let x = self.items[i];
        self.items.copy_within(i + 1..n, i);
        self.items[n - 1] = T::default();
        self.len -= 1;
        x
    }
    /// Removes the first `k` items.
    pub fn drain_front(&mut self, k: usize) {
        let n = self.len as usize;
        self.items.copy_within(k..n, 0);
        for x in &mut self.items[n - k..n] {
            *x = T::default();
        }
        self.len -= k as u8;
    }
    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

impl<T: Copy + Default, const N: usize> std::ops::Deref for Fifo<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.items[..self.len as usize]
    }
}

impl<T: Copy + Default, const N: usize> std::ops::DerefMut for Fifo<T, N> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.items[..self.len as usize]
    }
}

impl<T: Copy + Default, const N: usize> FromIterator<T> for Fifo<T, N> {
    fn from_iter<I: IntoIterator<Item = T>>(it: I) -> Self {
        let mut f = Self::default();
        for x in it {
            f.push(x);
        }
        f
    }
}
