//! The simulated disk: what each file held at its last sync, and what a power cut leaves.
//!
//! Writes go through to the real file at once (the real file is the operating system's
//! page cache: every handle reads the newest bytes). Before a sector is first changed
//! after a sync, its bytes as of that sync are saved (its *pre-image*), so the disk
//! knows, for every file, exactly which sectors a power cut may take back. A sync forgets
//! the pre-images: what was synced is on the platter. A cut decides, sector by sector,
//! what of the unsynced writes survived ([`Policy`]), writes the pre-images of the lost
//! sectors back and sets each file's length.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::rng::Rng;

/// The unit a disk writes atomically: a write larger than a sector (a 4 KiB page, a WAL
/// frame) can be torn between its sectors. 512 bytes: the finest tearing a real disk
/// shows, so the harshest.
pub const SECTOR: u64 = 512;

/// What a power cut does to the writes not synced yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Every unsynced write is lost; every file is back at its length at its last sync.
    DropUnsynced,
    /// Each unsynced sector independently reached the disk or not (writes torn between
    /// sectors, reordered among themselves); a file that grew ends at its synced length,
    /// its new length or a sector boundary between; the part of a lost sector past the
    /// synced length holds zeros or random garbage.
    Tear,
}

/// What one cut did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Files that held unsynced writes.
    pub files: usize,
    /// Unsynced sectors that reached the disk.
    pub kept: u64,
    /// Unsynced sectors that were lost (their last synced bytes written back).
    pub lost: u64,
    /// Sectors whose lost tail was filled with random garbage.
    pub garbage: u64,
    /// Bytes cut off the ends of files (unsynced growth or lost).
    pub truncated_bytes: u64,
}

impl std::ops::AddAssign for CutReport {
    fn add_assign(&mut self, other: CutReport) {
        self.files += other.files;
        self.kept += other.kept;
        self.lost += other.lost;
        self.garbage += other.garbage;
        self.truncated_bytes += other.truncated_bytes;
    }
}

/// One file's state since its last sync.
#[derive(Debug)]
pub(crate) struct FileState {
    path: PathBuf,
    /// A private read handle: pre-images are read through it (the same page cache).
    reader: File,
    /// The file's length at its last sync (or when first seen: what was on disk then).
    synced_len: u64,
    /// Sector number → its bytes at the last sync (the part below `synced_len`).
    undo: BTreeMap<u64, Vec<u8>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FileState {
    fn open(path: &Path) -> io::Result<Self> {
        let reader = File::open(path)?;
        let synced_len = reader.metadata()?.len();
        Ok(FileState {
            path: path.to_owned(),
            reader,
            synced_len,
            undo: BTreeMap::new(),
        })
    }

    /// Saves the pre-image of every sector in `start..end` not saved since the last sync.
    fn save(&mut self, start: u64, end: u64) -> io::Result<()> {
        if end <= start {
            return Ok(());
        }
        for sector in start / SECTOR..end.div_ceil(SECTOR) {
            if self.undo.contains_key(&sector) {
                continue;
            }
            let from = sector * SECTOR;
            let to = (from + SECTOR).min(self.synced_len);
            let mut bytes = vec![0; usize::try_from(to.saturating_sub(from)).unwrap_or(0)];
            read_fully(&self.reader, &mut bytes, from)?;
            self.undo.insert(sector, bytes);
        }
        Ok(())
    }

    /// Before a write of `len` bytes at `offset`.
    pub(crate) fn before_write(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.save(offset, offset.saturating_add(len))
    }

    /// Before the file is truncated to `size`: the bytes cut off may come back.
    pub(crate) fn before_truncate(&mut self, size: u64) -> io::Result<()> {
        let current = self.reader.metadata()?.len();
        self.save(size, current.max(self.synced_len))
    }

    /// A sync: everything written so far is durable.
    pub(crate) fn synced(&mut self) -> io::Result<()> {
        self.synced_len = self.reader.metadata()?.len();
        self.undo.clear();
        Ok(())
    }

    /// Applies a power cut to the real file. Every handle must be closed.
    fn cut(&self, policy: Policy, rng: &mut Rng) -> io::Result<CutReport> {
        let mut report = CutReport::default();
        let file = match OpenOptions::new().read(true).write(true).open(&self.path) {
            Ok(file) => file,
            // Deleted by SQLite itself since (deletions are durable in this model).
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(report),
            Err(e) => return Err(e),
        };
        let current = file.metadata()?.len();
        let synced = self.synced_len;
        if self.undo.is_empty() && current == synced {
            return Ok(report);
        }
        report.files = 1;
        let final_len = match policy {
            Policy::DropUnsynced => synced,
            Policy::Tear if current == synced => current,
            Policy::Tear => {
                let (low, high) = (synced.min(current), synced.max(current));
                match rng.below(3) {
                    0 => synced,
                    1 => current,
                    // A sector boundary strictly between, if there is one.
                    _ => {
                        let first = low.div_ceil(SECTOR);
                        let last = high / SECTOR;
                        if last > first {
                            (first + rng.below(last - first)) * SECTOR
                        } else {
                            current
                        }
                    }
                }
            }
        };
        file.set_len(current.max(synced).max(final_len))?;
        for (&sector, before) in &self.undo {
            let start = sector * SECTOR;
            if start >= final_len {
                continue;
            }
            if policy == Policy::Tear && rng.below(2) == 0 {
                report.kept += 1;
                continue;
            }
            report.lost += 1;
            file.write_all_at(before, start)?;
            // The part of the sector past the synced length never reached the disk: the
            // file system shows zeros there, or garbage.
            let tail = start + before.len() as u64;
            let end = (start + SECTOR).min(final_len);
            if end > tail {
                let mut fill = vec![0_u8; usize::try_from(end - tail).unwrap_or(0)];
                if policy == Policy::Tear && rng.below(2) == 0 {
                    rng.fill(&mut fill);
                    report.garbage += 1;
                }
                file.write_all_at(&fill, tail)?;
            }
        }
        report.truncated_bytes = current.saturating_sub(final_len);
        file.set_len(final_len)?;
        Ok(report)
    }
}

fn read_fully(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            // Shorter than its synced length (cannot happen: a truncation saves first):
            // the rest reads as zeros.
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The whole simulated machine: every tracked file, and the power switch.
#[derive(Debug)]
pub(crate) struct Disk {
    files: Mutex<HashMap<PathBuf, Arc<Mutex<FileState>>>>,
    /// Set at the cut: from then on nothing reaches any file.
    dead: AtomicBool,
    /// Write operations (writes, truncations, syncs, deletions) since the last arm.
    ops: AtomicU64,
    /// The operation before which the power goes (`u64::MAX`: never).
    cut_at: AtomicU64,
    /// Handles open on tracked files.
    open: AtomicUsize,
}

impl Disk {
    pub(crate) fn new() -> Self {
        Disk {
            files: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            ops: AtomicU64::new(0),
            cut_at: AtomicU64::new(u64::MAX),
            open: AtomicUsize::new(0),
        }
    }

    /// The state of the file at `path` (shared by every handle on it), for a new handle.
    pub(crate) fn attach(&self, path: &Path) -> io::Result<Arc<Mutex<FileState>>> {
        let mut files = lock(&self.files);
        let state = match files.get(path) {
            Some(state) => Arc::clone(state),
            None => {
                let state = Arc::new(Mutex::new(FileState::open(path)?));
                files.insert(path.to_owned(), Arc::clone(&state));
                state
            }
        };
        self.open.fetch_add(1, Ordering::SeqCst);
        Ok(state)
    }

    pub(crate) fn detach(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }

    /// The file at `path` is being deleted.
    pub(crate) fn forget(&self, path: &Path) {
        lock(&self.files).remove(path);
    }

    /// Counts one write operation; `false` when the power is (now) off and the operation
    /// must not happen.
    pub(crate) fn tick(&self) -> bool {
        if self.dead.load(Ordering::SeqCst) {
            return false;
        }
        let n = self.ops.fetch_add(1, Ordering::SeqCst) + 1;
        if n >= self.cut_at.load(Ordering::SeqCst) {
            self.dead.store(true, Ordering::SeqCst);
            return false;
        }
        true
    }

    pub(crate) fn arm(&self, before_op: u64) {
        self.ops.store(0, Ordering::SeqCst);
        self.cut_at.store(before_op.max(1), Ordering::SeqCst);
    }

    pub(crate) fn disarm(&self) {
        self.cut_at.store(u64::MAX, Ordering::SeqCst);
    }

    pub(crate) fn cut_now(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    pub(crate) fn ops(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }

    pub(crate) fn open_handles(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Applies the cut to every tracked file, then powers the machine back on with every
    /// file as the cut left it (now all durable).
    pub(crate) fn restart(&self, policy: Policy, rng: &mut Rng) -> io::Result<CutReport> {
        let mut files = lock(&self.files);
        let mut paths: Vec<PathBuf> = files.keys().cloned().collect();
        // Deterministic for a seed: the same files in the same order.
        paths.sort();
        let mut report = CutReport::default();
        for path in paths {
            if let Some(state) = files.get(&path) {
                report += lock(state).cut(policy, rng)?;
            }
        }
        files.clear();
        self.disarm();
        self.ops.store(0, Ordering::SeqCst);
        self.dead.store(false, Ordering::SeqCst);
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file with `synced` on disk, then `unsynced` written over it at `offset` (through
    /// the disk's bookkeeping, as the VFS does), cut under `policy`.
    fn cut(synced: &[u8], offset: u64, unsynced: &[u8], policy: Policy, seed: u64) -> Vec<u8> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::write(&path, synced).expect("write");
        let disk = Disk::new();
        let state = disk.attach(&path).expect("attach");
        {
            let mut state = lock(&state);
            state
                .before_write(offset, unsynced.len() as u64)
                .expect("pre-image");
            let file = OpenOptions::new().write(true).open(&path).expect("open");
            file.write_all_at(unsynced, offset).expect("write");
        }
        drop(state);
        disk.detach();
        disk.cut_now();
        disk.restart(policy, &mut Rng::new(seed)).expect("cut");
        std::fs::read(&path).expect("read")
    }

    #[test]
    fn a_cut_drops_every_unsynced_write() {
        let synced = vec![1_u8; 1024];
        let after = cut(&synced, 100, &[2; 2000], Policy::DropUnsynced, 1);
        assert_eq!(after, synced, "back to the synced bytes and length");
    }

    #[test]
    fn a_sync_makes_writes_survive_a_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::write(&path, [1_u8; 512]).expect("write");
        let disk = Disk::new();
        let state = disk.attach(&path).expect("attach");
        let file = OpenOptions::new().write(true).open(&path).expect("open");
        let mut guard = lock(&state);
        guard.before_write(0, 700).expect("pre-image");
        file.write_all_at(&[2; 700], 0).expect("write");
        guard.synced().expect("sync");
        guard.before_write(0, 10).expect("pre-image");
        file.write_all_at(&[3; 10], 0).expect("write");
        drop(guard);
        drop(state);
        disk.detach();
        disk.cut_now();
        disk.restart(Policy::DropUnsynced, &mut Rng::new(7))
            .expect("cut");
        assert_eq!(std::fs::read(&path).expect("read"), vec![2_u8; 700]);
    }

    #[test]
    fn a_torn_cut_keeps_or_loses_whole_sectors() {
        let synced = vec![1_u8; 4096];
        let mut torn = 0;
        for seed in 0..32 {
            let after = cut(&synced, 0, &[2; 4096], Policy::Tear, seed);
            assert_eq!(after.len(), 4096);
            let sectors: Vec<u8> = after
                .chunks(SECTOR as usize)
                .map(|s| {
                    assert!(
                        s.iter().all(|&b| b == s[0]),
                        "a sector is all old or all new"
                    );
                    s[0]
                })
                .collect();
            if sectors.contains(&1) && sectors.contains(&2) {
                torn += 1;
            }
        }
        assert!(torn > 0, "some page is torn between its sectors");
    }
}
