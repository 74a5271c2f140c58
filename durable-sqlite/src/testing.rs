//! Test-only options of [`SqliteStoreOptions`] (feature `testing`, hidden from the docs):
//! the power-loss tier (durable-powercut) opens the store through its crash-simulating
//! VFS, and its counterexample lowers `synchronous`. Without the feature these settings
//! keep their defaults: no VFS of a test's, `synchronous = FULL`, the durability checked.

use sqlx::sqlite::SqliteSynchronous;

#[cfg(feature = "testing")]
use crate::SqliteStoreOptions;

/// What the `testing` feature may change.
#[derive(Debug, Clone)]
pub(crate) struct Testing {
    /// An SQLite VFS registered by the test (a crash-simulating one).
    pub(crate) vfs: Option<String>,
    /// The `synchronous` level connections run with (`FULL` outside tests).
    pub(crate) synchronous: SqliteSynchronous,
    /// Report the store durable whatever its `synchronous` level.
    pub(crate) report_durable: bool,
}

impl Default for Testing {
    fn default() -> Self {
        Testing {
            vfs: None,
            synchronous: SqliteSynchronous::Full,
            report_durable: false,
        }
    }
}

/// The value `PRAGMA synchronous` reads back for `level`.
pub(crate) fn synchronous_level(level: SqliteSynchronous) -> i64 {
    match level {
        SqliteSynchronous::Off => 0,
        SqliteSynchronous::Normal => 1,
        SqliteSynchronous::Full => 2,
        SqliteSynchronous::Extra => 3,
    }
}

#[cfg(feature = "testing")]
impl SqliteStoreOptions {
    /// Test-only (feature `testing`): open the file through the SQLite VFS registered
    /// under `name`, such as the power-cut simulator of durable's own tests.
    #[doc(hidden)]
    pub fn vfs(mut self, name: impl Into<String>) -> Self {
        self.testing.vfs = Some(name.into());
        self
    }

    /// Test-only (feature `testing`), **loses acknowledged writes on power loss**: run
    /// every connection with `synchronous = level` instead of `FULL`, and open instead
    /// of refusing with [`StoreError::NotDurable`](durable_core::StoreError::NotDurable).
    /// [`durability`](durable_core::store::StoreBase::durability) still names the
    /// setting, so unsafe tools still refuse, unless
    /// [`dangerous_report_durable`](Self::dangerous_report_durable) is set too.
    #[doc(hidden)]
    pub fn dangerous_synchronous(mut self, level: SqliteSynchronous) -> Self {
        self.testing.synchronous = level;
        self
    }

    /// Test-only (feature `testing`), **lets unsafe tools run on a store that can lose
    /// their *issued* rows**: [`durability`](durable_core::store::StoreBase::durability)
    /// reports the store durable whatever its settings, as a store that never checked
    /// them would. It exists so the power-loss tests can show what the check prevents.
    #[doc(hidden)]
    pub fn dangerous_report_durable(mut self, report: bool) -> Self {
        self.testing.report_durable = report;
        self
    }
}
