//! Id allocation the way server 0.8.0 does it for streams, topics, groups, members and users.

/// Id allocation of the `slab` crate that server 0.8.0 uses for streams, topics, groups and
/// members: the next id is the most recently freed slot (a LIFO free list), or the end.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    /// Slots; vacant ones link the free list.
    entries: Vec<Entry<T>>,
    /// Head of the free list (== `entries.len()` when full).
    next: usize,
    /// Occupied slots.
    len: usize,
}

#[derive(Debug)]
enum Entry<T> {
    Vacant(usize),
    Occupied(T),
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            next: 0,
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    /// The key the next `insert` will use.
    #[cfg(test)]
    pub(crate) fn vacant_key(&self) -> usize {
        self.next
    }

    /// Stores `value` at the head of the free list (or the end) and returns that key.
    pub(crate) fn insert(&mut self, value: T) -> usize {
        let key = self.next;
        self.len += 1;
        if key == self.entries.len() {
            self.entries.push(Entry::Occupied(value));
            self.next = key + 1;
        } else {
            match std::mem::replace(&mut self.entries[key], Entry::Occupied(value)) {
                Entry::Vacant(next) => self.next = next,
                Entry::Occupied(_) => unreachable!("slab free list points at an occupied slot"),
            }
        }
        key
    }

    /// Stores `value` at an explicit key (restoring persisted state); the free list is rebuilt
    /// in ascending key order afterwards by [`Self::rebuild_free_list`].
    pub(crate) fn insert_at(&mut self, key: usize, value: T) {
        while self.entries.len() <= key {
            self.entries.push(Entry::Vacant(usize::MAX));
        }
        if matches!(self.entries[key], Entry::Vacant(_)) {
            self.len += 1;
        }
        self.entries[key] = Entry::Occupied(value);
    }

    /// Re-links vacant slots after [`Self::insert_at`] calls, lowest key first.
    pub(crate) fn rebuild_free_list(&mut self) {
        let mut next = self.entries.len();
        for (key, entry) in self.entries.iter_mut().enumerate().rev() {
            if let Entry::Vacant(n) = entry {
                *n = next;
                next = key;
            }
        }
        self.next = next;
    }

    /// Removes and returns the value at `key`, freeing the slot for reuse first.
    pub(crate) fn remove(&mut self, key: usize) -> Option<T> {
        let entry = self.entries.get_mut(key)?;
        if matches!(entry, Entry::Vacant(_)) {
            return None;
        }
        let old = std::mem::replace(entry, Entry::Vacant(self.next));
        self.next = key;
        self.len -= 1;
        match old {
            Entry::Occupied(v) => Some(v),
            Entry::Vacant(_) => None,
        }
    }

    pub(crate) fn get(&self, key: usize) -> Option<&T> {
        match self.entries.get(key)? {
            Entry::Occupied(v) => Some(v),
            Entry::Vacant(_) => None,
        }
    }

    pub(crate) fn get_mut(&mut self, key: usize) -> Option<&mut T> {
        match self.entries.get_mut(key)? {
            Entry::Occupied(v) => Some(v),
            Entry::Vacant(_) => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Occupied entries in ascending key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(k, e)| match e {
                Entry::Occupied(v) => Some((k, v)),
                Entry::Vacant(_) => None,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    #[test]
    fn slab_reuses_the_most_recently_freed_slot() {
        let mut slab = Slab::default();
        for i in 0..5 {
            check!(slab.insert(i) == i);
        }
        slab.remove(1);
        slab.remove(3);
        check!(slab.vacant_key() == 3);
        check!(slab.insert(30) == 3);
        check!(slab.insert(10) == 1);
        check!(slab.insert(5) == 5);
        check!(slab.len() == 6);
        check!(slab.iter().map(|(k, _)| k).collect::<Vec<_>>() == vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn slab_remove_of_vacant_is_none() {
        let mut slab = Slab::default();
        slab.insert(1);
        check!(slab.remove(0) == Some(1));
        check!(slab.remove(0).is_none());
        check!(slab.remove(7).is_none());
        check!(slab.len() == 0);
    }

    #[test]
    fn slab_rebuilt_free_list_starts_at_lowest_gap() {
        let mut slab = Slab::default();
        slab.insert_at(2, 'c');
        slab.insert_at(0, 'a');
        slab.rebuild_free_list();
        check!(slab.len() == 2);
        check!(slab.insert('b') == 1);
        check!(slab.insert('d') == 3);
    }
}
