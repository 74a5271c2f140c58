//! The VFS shim: SQLite's C interface around [`Disk`], over the default `unix` VFS.
//!
//! Every file SQLite opens is opened by the `unix` VFS into the tail of our file object;
//! our methods forward to it. Named files (the database, its `-wal`, a rollback journal)
//! are tracked: a write or truncation first saves the pre-images of the sectors it
//! changes, a sync marks the file durable (without calling `fsync`: the simulated disk is
//! the model, and the host never loses power), and once the power is cut, writes, syncs,
//! truncations and deletions fail with `SQLITE_IOERR_*` without touching the file. Reads,
//! locks and the shared-memory index (`-shm`, never synced by SQLite, rebuilt from the
//! WAL by the first connection after a restart) go straight through.
//!
//! This is the only module of the crate that uses `unsafe`: each function dereferences
//! pointers SQLite hands it, under the VFS contract (<https://sqlite.org/c3ref/vfs.html>,
//! <https://sqlite.org/c3ref/io_methods.html>).

#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::mem::size_of;
use std::path::PathBuf;
use std::ptr;
use std::sync::{Arc, Mutex, PoisonError};

use libsqlite3_sys as ffi;

use crate::disk::{Disk, FileState};

/// Our part of a file object; the `unix` VFS's file object follows at [`HEADER`].
#[repr(C)]
struct CutFile {
    /// Must come first: SQLite sees a `sqlite3_file`.
    base: ffi::sqlite3_file,
    disk: *const Disk,
    /// `Arc::into_raw` of the file's shared state; null for an untracked file.
    state: *const Mutex<FileState>,
    /// The `unix` VFS's file object, inside the same allocation.
    real: *mut ffi::sqlite3_file,
}

/// Our header's size, rounded up so the real file object stays aligned.
const HEADER: usize = size_of::<CutFile>().div_ceil(16) * 16;

/// What our `sqlite3_vfs` points at (`pAppData`).
struct AppData {
    disk: Arc<Disk>,
    real: *mut ffi::sqlite3_vfs,
}

/// Registers a VFS named `name` over the default `unix` VFS, not as the default.
/// Returns the SQLite result code on failure. The registration (and `disk`) lives for
/// the rest of the process: SQLite may hold the VFS in any connection.
pub(crate) fn register(name: &str, disk: Arc<Disk>) -> Result<(), String> {
    let zname = CString::new(name).map_err(|_| format!("VFS name {name:?} contains NUL"))?;
    // SAFETY: a NUL-terminated name; `sqlite3_vfs_find` initializes SQLite if needed and
    // returns a VFS that lives as long as the process (the built-in `unix`).
    let real = unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()) };
    if real.is_null() {
        return Err("SQLite has no `unix` VFS (not a Unix build)".to_owned());
    }
    // SAFETY: `real` is a valid, registered VFS.
    let mut vfs: ffi::sqlite3_vfs = unsafe { ptr::read(real) };
    let real_size = vfs.szOsFile;
    vfs.szOsFile = c_int::try_from(HEADER).map_err(|e| e.to_string())? + real_size;
    vfs.pNext = ptr::null_mut();
    vfs.zName = zname.into_raw();
    vfs.pAppData = Box::into_raw(Box::new(AppData { disk, real })).cast::<c_void>();
    vfs.xOpen = Some(x_open);
    vfs.xDelete = Some(x_delete);
    // The other methods (path names, access, randomness, time, sleep, system calls) are
    // the `unix` VFS's own; none of them reads `pAppData`.
    let vfs = Box::into_raw(Box::new(vfs));
    // SAFETY: `vfs` is a complete VFS that is never freed.
    let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 0) };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(format!("sqlite3_vfs_register failed with code {rc}"))
    }
}

/// # Safety
/// `vfs` is one of ours.
unsafe fn app<'a>(vfs: *mut ffi::sqlite3_vfs) -> &'a AppData {
    // SAFETY: our VFS's `pAppData` is a leaked `AppData`.
    unsafe { &*((*vfs).pAppData as *const AppData) }
}

/// # Safety
/// `file` was opened by [`x_open`].
unsafe fn parts<'a>(
    file: *mut ffi::sqlite3_file,
) -> (
    &'a Disk,
    Option<&'a Mutex<FileState>>,
    *mut ffi::sqlite3_file,
    &'a ffi::sqlite3_io_methods,
) {
    // SAFETY: our file objects start with `CutFile`; `disk` outlives every file and
    // `state` holds a strong count until `x_close`; `real` was opened successfully.
    unsafe {
        let f = &*(file as *const CutFile);
        (&*f.disk, f.state.as_ref(), f.real, &*(*f.real).pMethods)
    }
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite hands us our VFS and `szOsFile` bytes at `file`.
    unsafe {
        let app = app(vfs);
        let ours = file.cast::<CutFile>();
        let real = file.cast::<u8>().add(HEADER).cast::<ffi::sqlite3_file>();
        ours.write(CutFile {
            base: ffi::sqlite3_file {
                pMethods: ptr::null(),
            },
            disk: Arc::as_ptr(&app.disk),
            state: ptr::null(),
            real,
        });
        (*real).pMethods = ptr::null();
        let Some(open) = (*app.real).xOpen else {
            return ffi::SQLITE_CANTOPEN;
        };
        let rc = open(app.real, name, real, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            // SQLite calls `xClose` only on a file whose `pMethods` is set: ours is
            // not, so close the real one here if it needs it.
            close_real(real);
            return rc;
        }
        let tracked =
            ffi::SQLITE_OPEN_MAIN_DB | ffi::SQLITE_OPEN_WAL | ffi::SQLITE_OPEN_MAIN_JOURNAL;
        if !name.is_null() && flags & tracked != 0 {
            let path = PathBuf::from(CStr::from_ptr(name).to_string_lossy().into_owned());
            match app.disk.attach(&path) {
                Ok(state) => (*ours).state = Arc::into_raw(state),
                Err(_) => {
                    close_real(real);
                    return ffi::SQLITE_CANTOPEN;
                }
            }
        }
        let version = (*(*real).pMethods).iVersion.clamp(1, 3);
        (*ours).base.pMethods = &METHODS[usize::try_from(version - 1).unwrap_or(0)];
        ffi::SQLITE_OK
    }
}

/// # Safety
/// `real` is a file object the real VFS may have opened.
unsafe fn close_real(real: *mut ffi::sqlite3_file) {
    // SAFETY: a non-null `pMethods` means the real VFS wants `xClose`.
    unsafe {
        if let Some(methods) = (*real).pMethods.as_ref()
            && let Some(close) = methods.xClose
        {
            close(real);
        }
    }
}

unsafe extern "C" fn x_delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    // SAFETY: our VFS, a NUL-terminated path.
    unsafe {
        let app = app(vfs);
        if !app.disk.tick() {
            return ffi::SQLITE_IOERR_DELETE;
        }
        if !name.is_null() {
            app.disk.forget(&PathBuf::from(
                CStr::from_ptr(name).to_string_lossy().into_owned(),
            ));
        }
        match (*app.real).xDelete {
            Some(delete) => delete(app.real, name, sync_dir),
            None => ffi::SQLITE_IOERR_DELETE,
        }
    }
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: one of our files, closed once.
    unsafe {
        let (disk, _, real, methods) = parts(file);
        let rc = methods.xClose.map_or(ffi::SQLITE_OK, |close| close(real));
        let ours = file.cast::<CutFile>();
        if !(*ours).state.is_null() {
            drop(Arc::from_raw((*ours).state));
            (*ours).state = ptr::null();
            disk.detach();
        }
        rc
    }
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: forwarded as given.
    unsafe {
        let (_, _, real, methods) = parts(file);
        methods.xRead.map_or(ffi::SQLITE_IOERR_READ, |read| {
            read(real, buf, amount, offset)
        })
    }
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: forwarded as given, under the file's lock.
    unsafe {
        let (disk, state, real, methods) = parts(file);
        let Some(write) = methods.xWrite else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let Some(state) = state else {
            return write(real, buf, amount, offset);
        };
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        if !disk.tick() {
            return ffi::SQLITE_IOERR_WRITE;
        }
        let (Ok(at), Ok(len)) = (u64::try_from(offset), u64::try_from(amount)) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        if state.before_write(at, len).is_err() {
            return ffi::SQLITE_IOERR_WRITE;
        }
        write(real, buf, amount, offset)
    }
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    // SAFETY: forwarded as given, under the file's lock.
    unsafe {
        let (disk, state, real, methods) = parts(file);
        let Some(truncate) = methods.xTruncate else {
            return ffi::SQLITE_IOERR_TRUNCATE;
        };
        let Some(state) = state else {
            return truncate(real, size);
        };
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        if !disk.tick() {
            return ffi::SQLITE_IOERR_TRUNCATE;
        }
        let Ok(at) = u64::try_from(size) else {
            return ffi::SQLITE_IOERR_TRUNCATE;
        };
        if state.before_truncate(at).is_err() {
            return ffi::SQLITE_IOERR_TRUNCATE;
        }
        truncate(real, size)
    }
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: forwarded as given, under the file's lock.
    unsafe {
        let (disk, state, real, methods) = parts(file);
        let Some(state) = state else {
            return methods
                .xSync
                .map_or(ffi::SQLITE_IOERR_FSYNC, |sync| sync(real, flags));
        };
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        if !disk.tick() {
            return ffi::SQLITE_IOERR_FSYNC;
        }
        // No real fsync: the simulated disk decides what survives a cut.
        if state.synced().is_err() {
            return ffi::SQLITE_IOERR_FSYNC;
        }
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn x_file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: forwarded as given.
    unsafe {
        let (_, _, real, methods) = parts(file);
        methods
            .xFileSize
            .map_or(ffi::SQLITE_IOERR_FSTAT, |f| f(real, size))
    }
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: forwarded as given.
    unsafe {
        let (_, _, real, methods) = parts(file);
        methods
            .xLock
            .map_or(ffi::SQLITE_IOERR_LOCK, |f| f(real, level))
    }
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: forwarded as given.
    unsafe {
        let (_, _, real, methods) = parts(file);
        methods
            .xUnlock
            .map_or(ffi::SQLITE_IOERR_UNLOCK, |f| f(real, level))
    }
}

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: forwarded as given.
    unsafe {
        let (_, _, real, methods) = parts(file);
        methods
            .xCheckReservedLock
            .map_or(ffi::SQLITE_IOERR_CHECKRESERVEDLOCK, |f| f(real, out))
    }
}

unsafe extern "C" fn x_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: forwarded as given.
    unsafe {
        let (_, _, real, methods) = parts(file);
        methods
            .xFileControl
            .map_or(ffi::SQLITE_NOTFOUND, |f| f(real, op, arg))
    }
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: forwarded as given.
    unsafe {
        let (_, _, real, methods) = parts(file);
        methods.xSectorSize.map_or(4096, |f| f(real))
    }
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: forwarded as given.
    unsafe {
        let (_, _, real, methods) = parts(file);
        methods.xDeviceCharacteristics.map_or(0, |f| f(real))
    }
}

unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: forwarded as given (only present when the real methods have it).
    unsafe {
        let (_, _, real, methods) = parts(file);
        methods.xShmMap.map_or(ffi::SQLITE_IOERR_SHMMAP, |f| {
            f(real, region, size, extend, out)
        })
    }
}

unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded as given.
    unsafe {
        let (_, _, real, methods) = parts(file);
        methods
            .xShmLock
            .map_or(ffi::SQLITE_IOERR_SHMLOCK, |f| f(real, offset, n, flags))
    }
}

unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: forwarded as given.
    unsafe {
        let (_, _, real, methods) = parts(file);
        if let Some(f) = methods.xShmBarrier {
            f(real);
        }
    }
}

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    // SAFETY: forwarded as given.
    unsafe {
        let (_, _, real, methods) = parts(file);
        methods
            .xShmUnmap
            .map_or(ffi::SQLITE_OK, |f| f(real, delete))
    }
}

unsafe extern "C" fn x_fetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: forwarded as given; without it (or with memory mapping off) SQLite reads.
    unsafe {
        let (_, _, real, methods) = parts(file);
        match methods.xFetch {
            Some(f) => f(real, offset, amount, out),
            None => {
                *out = ptr::null_mut();
                ffi::SQLITE_OK
            }
        }
    }
}

unsafe extern "C" fn x_unfetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    page: *mut c_void,
) -> c_int {
    // SAFETY: forwarded as given.
    unsafe {
        let (_, _, real, methods) = parts(file);
        methods
            .xUnfetch
            .map_or(ffi::SQLITE_OK, |f| f(real, offset, page))
    }
}

const fn methods(version: c_int) -> ffi::sqlite3_io_methods {
    ffi::sqlite3_io_methods {
        iVersion: version,
        xClose: Some(x_close),
        xRead: Some(x_read),
        xWrite: Some(x_write),
        xTruncate: Some(x_truncate),
        xSync: Some(x_sync),
        xFileSize: Some(x_file_size),
        xLock: Some(x_lock),
        xUnlock: Some(x_unlock),
        xCheckReservedLock: Some(x_check_reserved_lock),
        xFileControl: Some(x_file_control),
        xSectorSize: Some(x_sector_size),
        xDeviceCharacteristics: Some(x_device_characteristics),
        xShmMap: if version >= 2 { Some(x_shm_map) } else { None },
        xShmLock: if version >= 2 { Some(x_shm_lock) } else { None },
        xShmBarrier: if version >= 2 {
            Some(x_shm_barrier)
        } else {
            None
        },
        xShmUnmap: if version >= 2 {
            Some(x_shm_unmap)
        } else {
            None
        },
        xFetch: if version >= 3 { Some(x_fetch) } else { None },
        xUnfetch: if version >= 3 { Some(x_unfetch) } else { None },
    }
}

/// One method table per `iVersion` the real file may report (1 to 3).
static METHODS: [ffi::sqlite3_io_methods; 3] = [methods(1), methods(2), methods(3)];
