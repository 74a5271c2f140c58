//! A throwaway PostgreSQL for tests (feature `testing`).
//!
//! [`test_database`] returns a fresh, empty database per call, so tests are isolated:
//!
//! - with `DATABASE_URL` set, it creates `durable_test_<random>` on that server (the role
//!   needs `CREATEDB`; the databases are left behind for inspection — drop them with
//!   `SELECT 'DROP DATABASE ' || datname FROM pg_database WHERE datname LIKE 'durable_test_%'`);
//! - otherwise it starts **one** cluster per test process from the machine's PostgreSQL
//!   binaries and creates the databases there.
//!
//! # The throwaway cluster
//! The binaries are taken from `$DURABLE_PG_BINDIR`, else the first `PATH` directory that
//! holds both `initdb` and `postgres`, else the newest `/usr/lib/postgresql/<version>/bin`
//! (Debian's layout; `apt-get install postgresql`). Without binaries and without
//! `DATABASE_URL` the call panics with instructions: Postgres tests never skip silently.
//!
//! 1. `initdb -D <tmp>/data -A trust -U postgres --no-sync` in a fresh directory
//!    `$TMPDIR/durable-pg-*`. `initdb` refuses to run as root, so when the tests run as
//!    root every command runs as the `postgres` OS user (set with `Command::uid`/`gid`;
//!    the directory is chowned to it). Debian's package creates that user; if it is
//!    missing it is created with `useradd --system --no-create-home postgres`.
//! 2. The server listens on `127.0.0.1` only, on a port of its own (found by binding port
//!    0), with its Unix socket in the temporary directory. `fsync` stays **on**, so
//!    [`durability`](durable_core::store::StoreBase::durability) reports the cluster as
//!    durable, as production servers are.
//! 3. The server is started by a small `sh` watchdog whose stdin is a pipe from this
//!    process. Nothing ever writes to it; when the test process exits — normally, by
//!    panic, or killed with SIGKILL — the kernel closes the pipe, the watchdog's `cat`
//!    sees end-of-file, stops the server with SIGQUIT (immediate shutdown: no shutdown
//!    checkpoint, the data is thrown away anyway) and deletes the directory. The watchdog runs in its own process group, so a Ctrl-C aimed at
//!    `cargo test` does not kill it before it cleans up. No cluster outlives its tests.
//!
//! Readiness is polled by connecting, for at most 30 s; a failure panics with the server
//! log. Starting takes about a second; every [`test_database`] after that is one
//! `CREATE DATABASE`.
//!
//! Tests of crash recovery can crash the server itself with
//! [`TestDatabase::restart_server`] (`pg_ctl restart -m immediate`); it refuses to touch a
//! `DATABASE_URL` server.

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use durable_core::StoreError;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::OnceCell;

use crate::PostgresStore;

/// A fresh database of its own for one test. Its `Debug` output hides the password of
/// the URL.
#[derive(Clone, PartialEq, Eq)]
pub struct TestDatabase {
    url: String,
    name: String,
    /// Whether it lives on this process's throwaway cluster (not on `DATABASE_URL`).
    throwaway: bool,
}

impl std::fmt::Debug for TestDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDatabase")
            .field("url", &durable_core::redact::redact_url(&self.url))
            .field("name", &self.name)
            .field("throwaway", &self.throwaway)
            .finish()
    }
}

impl TestDatabase {
    /// The database's `postgres://` URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name (`durable_test_<random>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connects a store to the database (running the migrations).
    ///
    /// # Errors
    /// As [`PostgresStore::connect`].
    pub async fn store(&self) -> Result<PostgresStore, StoreError> {
        PostgresStore::connect(&self.url).await
    }

    /// Crashes and restarts the server this database lives on: `pg_ctl restart -m
    /// immediate` (no shutdown checkpoint; the server runs crash recovery on start, as
    /// after a power cut). Every open connection is cut; committed data survives. Blocks
    /// until the server accepts connections again (about a second).
    ///
    /// Only for the throwaway cluster: a server named by `DATABASE_URL` is never touched.
    ///
    /// # Errors
    /// When the database is on `DATABASE_URL`'s server, when the cluster's binary
    /// directory has no `pg_ctl`, or when `pg_ctl` fails (the message carries its output).
    pub fn restart_server(&self) -> Result<(), String> {
        let cluster = match CLUSTER.get() {
            Some(Ok(cluster)) if self.throwaway => cluster,
            _ => {
                return Err(format!(
                    "restart_server only restarts the throwaway cluster; {} is on DATABASE_URL's \
                     server, which tests never restart",
                    self.name
                ));
            }
        };
        cluster.restart()
    }
}

/// Creates a fresh database on `DATABASE_URL`'s server, or on a throwaway cluster started
/// once per process (see the [module docs](self)).
///
/// # Panics
/// When no server can be had: no `DATABASE_URL` and no PostgreSQL binaries, a cluster
/// that does not start (the message carries its log), or a failing `CREATE DATABASE`.
pub async fn test_database() -> TestDatabase {
    let (admin_url, throwaway) = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => (url, false),
        _ => match CLUSTER.get_or_init(Cluster::start).await {
            Ok(cluster) => (cluster.admin_url.clone(), true),
            Err(e) => panic!("{e}"),
        },
    };
    let name = format!("durable_test_{}", uuid::Uuid::new_v4().simple());
    let mut conn = PgConnection::connect(&admin_url).await.unwrap_or_else(|e| {
        panic!(
            "cannot connect to the test server at {}: {e}",
            durable_core::redact::redact_url(&admin_url)
        )
    });
    // The name is ours (letters, digits, underscore), so formatting it into the
    // statement is safe; CREATE DATABASE takes no parameters.
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot create test database {name} at {}: {e} (the role needs CREATEDB)",
                durable_core::redact::redact_url(&admin_url)
            )
        });
    let _ = conn.close().await;
    TestDatabase {
        url: with_database(&admin_url, &name),
        name,
        throwaway,
    }
}

/// The role of the throwaway cluster that logs in with a password (see [`password_role`]).
pub const PASSWORD_ROLE: &str = "durable_password_auth";

/// For tests of authentication: creates (or resets) [`PASSWORD_ROLE`] on the throwaway
/// cluster with `password` and returns the URL of `database` for it *without* a password
/// (add `:<password>` after the user name, right or wrong). The cluster requires that
/// role to authenticate with SCRAM over TCP; every other role is trusted.
///
/// # Errors
/// When tests run against `DATABASE_URL` (whose authentication this harness does not
/// control) instead of the throwaway cluster.
pub async fn password_role(database: &TestDatabase, password: &str) -> Result<String, String> {
    let cluster = match CLUSTER.get() {
        Some(Ok(cluster)) if database.throwaway => cluster,
        _ => {
            return Err(format!(
                "password_role needs the throwaway cluster; {} is on DATABASE_URL's server",
                database.name
            ));
        }
    };
    let mut conn = PgConnection::connect(&cluster.admin_url)
        .await
        .map_err(|e| format!("cannot connect to the test cluster: {e}"))?;
    let quoted = password.replace('\'', "''");
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
            .bind(PASSWORD_ROLE)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
    let verb = if exists { "ALTER" } else { "CREATE" };
    sqlx::query(AssertSqlSafe(format!(
        "{verb} ROLE {PASSWORD_ROLE} LOGIN SUPERUSER PASSWORD '{quoted}'"
    )))
    .execute(&mut conn)
    .await
    .map_err(|e| e.to_string())?;
    let _ = conn.close().await;
    let url = with_database(&cluster.admin_url, &database.name);
    Ok(url.replacen("postgres@", &format!("{PASSWORD_ROLE}@"), 1))
}

/// The cluster of this process, started on first use.
static CLUSTER: OnceCell<Result<Cluster, String>> = OnceCell::const_new();

/// A running throwaway cluster.
#[derive(Debug)]
struct Cluster {
    admin_url: String,
    /// The PostgreSQL binaries.
    bin: PathBuf,
    /// The temporary root (`data/`, the socket, `server.log`).
    root: PathBuf,
    /// The `postgres` OS user's uid/gid when this process is root.
    user: Option<(u32, u32)>,
    /// The watchdog. Never dropped (it lives in a static): its stdin pipe closes only when
    /// this process exits, which is what stops the server.
    _watchdog: Mutex<Child>,
}

/// The watchdog: starts the server, waits for end-of-file on stdin (this process
/// exiting), then stops the server and removes its directory.
/// `$0` = postgres binary, `$1` = temporary root, `$2` = port.
///
/// After [`TestDatabase::restart_server`] the running postmaster is `pg_ctl`'s, not the
/// watchdog's child, so the watchdog also stops whichever postmaster `postmaster.pid`
/// names, and waits for it to exit before removing the directory.
const WATCHDOG: &str = r#"
"$0" -D "$1/data" -k "$1" -h 127.0.0.1 -p "$2" -c max_connections=300 \
     -c shared_buffers=32MB >"$1/server.log" 2>&1 </dev/null &
pg=$!
cat >/dev/null
kill -QUIT "$pg" 2>/dev/null
current=$(head -n 1 "$1/data/postmaster.pid" 2>/dev/null)
if [ -n "$current" ] && [ "$current" != "$pg" ]; then
  kill -QUIT "$current" 2>/dev/null
  while kill -0 "$current" 2>/dev/null; do sleep 0.1; done
fi
wait "$pg"
rm -rf "$1"
"#;

impl Cluster {
    async fn start() -> Result<Self, String> {
        let started = Instant::now();
        let bin = find_binaries()?;
        let user = run_as()?;
        let root = tempfile::Builder::new()
            .prefix("durable-pg-")
            .tempdir()
            .map_err(|e| format!("cannot create a temporary directory for PostgreSQL: {e}"))?;
        if let Some((uid, gid)) = user {
            chown(root.path(), Some(uid), Some(gid))
                .map_err(|e| format!("cannot chown {} to postgres: {e}", root.path().display()))?;
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(root.path().join("data"))
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
            .current_dir(root.path());
        as_user(&mut initdb, user);
        let out = initdb
            .output()
            .map_err(|e| format!("cannot run {}: {e}", bin.join("initdb").display()))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // One role logs in with a password (SCRAM) over TCP, so that tests can see what
        // an authentication failure looks like ([`password_role`]); every other role is
        // trusted, as before.
        let hba = root.path().join("data").join("pg_hba.conf");
        let trusted = std::fs::read_to_string(&hba)
            .map_err(|e| format!("cannot read {}: {e}", hba.display()))?;
        std::fs::write(
            &hba,
            format!(
                "host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n\
                 host all {PASSWORD_ROLE} ::1/128 scram-sha-256\n{trusted}"
            ),
        )
        .map_err(|e| format!("cannot write {}: {e}", hba.display()))?;
        // From here on the watchdog owns the directory and removes it.
        let root = root.keep();
        let mut last_error = String::new();
        for _ in 0..5 {
            match Self::launch(&bin, &root, user).await {
                Ok((admin_url, child)) => {
                    eprintln!(
                        "durable-postgres: test cluster ready at {admin_url} in {:.2} s ({})",
                        started.elapsed().as_secs_f64(),
                        root.display()
                    );
                    return Ok(Cluster {
                        admin_url,
                        bin,
                        root,
                        user,
                        _watchdog: Mutex::new(child),
                    });
                }
                Err((retry, e)) => {
                    last_error = e;
                    if !retry {
                        break;
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&root);
        Err(last_error)
    }

    /// `pg_ctl restart -m immediate`, reusing the options the postmaster was started with
    /// (`postmaster.opts`: same port, socket directory and settings).
    fn restart(&self) -> Result<(), String> {
        let pg_ctl = self.bin.join("pg_ctl");
        if !pg_ctl.is_file() {
            return Err(format!(
                "no `pg_ctl` next to `postgres` in {}; cannot restart the test cluster",
                self.bin.display()
            ));
        }
        let mut cmd = Command::new(&pg_ctl);
        cmd.arg("restart")
            .arg("-D")
            .arg(self.root.join("data"))
            .args(["-m", "immediate", "-w", "-t", "60", "-l"])
            .arg(self.root.join("server.log"))
            .current_dir(&self.root)
            .stdin(Stdio::null());
        as_user(&mut cmd, self.user);
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run {}: {e}", pg_ctl.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`pg_ctl restart -m immediate` failed ({}):\n{}{}\nserver log:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                read_log(&self.root.join("server.log"))
            ))
        }
    }

    /// Starts the server on a free port and waits until it accepts connections. On
    /// failure says whether another port is worth a try.
    async fn launch(
        bin: &Path,
        root: &Path,
        user: Option<(u32, u32)>,
    ) -> Result<(String, Child), (bool, String)> {
        let port = free_port().map_err(|e| (false, e))?;
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(WATCHDOG)
            .arg(bin.join("postgres"))
            .arg(root)
            .arg(port.to_string())
            .current_dir(root)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        as_user(&mut sh, user);
        let mut child = sh
            .spawn()
            .map_err(|e| (false, format!("cannot start the PostgreSQL watchdog: {e}")))?;
        let admin_url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        let deadline = Instant::now() + Duration::from_secs(30);
        let log = root.join("server.log");
        loop {
            match PgConnection::connect(&admin_url).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    return Ok((admin_url, child));
                }
                Err(e) => {
                    let log_text = read_log(&log);
                    let bind_failed = log_text.contains("could not bind")
                        || log_text.contains("could not create any TCP/IP sockets");
                    let exited = log_text.contains("database system is shut down");
                    if bind_failed || exited || Instant::now() >= deadline {
                        // Closing stdin makes the watchdog clean up; wait for it so the
                        // next attempt starts from a stopped server.
                        drop(child.stdin.take());
                        let _ = child.wait();
                        return Err((
                            bind_failed,
                            format!(
                                "the throwaway PostgreSQL on 127.0.0.1:{port} did not become ready \
                                 ({e}); server log {}:\n{log_text}",
                                log.display()
                            ),
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// `url` with its database replaced by `name` (query parameters kept).
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.find('?') {
        Some(i) => url.split_at(i),
        None => (url, ""),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    format!("{}/{name}{query}", &base[..path_start])
}

/// Reads the server log (best effort).
fn read_log(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    text
}

/// A port nobody listens on right now.
fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port on 127.0.0.1: {e}"))
}

/// Runs `cmd` as `user` when given.
fn as_user(cmd: &mut Command, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        cmd.uid(uid)
            .gid(gid)
            .env("HOME", "/tmp")
            .env("USER", "postgres");
    }
}

/// The directory with `initdb` and `postgres`.
fn find_binaries() -> Result<PathBuf, String> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = std::env::var_os("DURABLE_PG_BINDIR") {
        let dir = PathBuf::from(dir);
        return if has_both(&dir) {
            Ok(dir)
        } else {
            Err(format!(
                "DURABLE_PG_BINDIR={} holds no `initdb` and `postgres`; point it at a PostgreSQL \
                 bin directory (e.g. /usr/lib/postgresql/15/bin) or unset it",
                dir.display()
            ))
        };
    }
    if let Some(path) = std::env::var_os("PATH")
        && let Some(dir) = std::env::split_paths(&path).find(|d| has_both(d))
    {
        return Ok(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_both(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        "PostgreSQL tests need a server: set DATABASE_URL (a role with CREATEDB), or install \
         Debian's postgresql package (`apt-get install postgresql`) so that `initdb` and \
         `postgres` are on PATH or under /usr/lib/postgresql/<version>/bin (or point \
         DURABLE_PG_BINDIR at them)"
            .to_owned()
    })
}

/// When this process is root, the uid/gid of the `postgres` user to run the cluster as
/// (created if missing); `None` otherwise.
fn run_as() -> Result<Option<(u32, u32)>, String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .map(str::to_owned)
        .or_else(|| command_output(Command::new("id").arg("-u")).ok());
    if euid.as_deref() != Some("0") {
        return Ok(None);
    }
    if command_output(Command::new("id").args(["-u", "postgres"])).is_err() {
        command_output(Command::new("useradd").args(["--system", "--no-create-home", "postgres"]))
            .map_err(|e| {
                format!(
                    "initdb refuses to run as root and there is no `postgres` user: \
                     `useradd --system postgres` failed: {e}"
                )
            })?;
    }
    let id = |flag: &str| -> Result<u32, String> {
        command_output(Command::new("id").args([flag, "postgres"]))?
            .parse()
            .map_err(|e| format!("`id {flag} postgres` did not print a number: {e}"))
    };
    Ok(Some((id("-u")?, id("-g")?)))
}

/// Runs a command, returning its trimmed stdout or an error with its stderr.
fn command_output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn with_database_replaces_only_the_path() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/app?sslmode=disable", "t1"),
            "postgres://u:p@h:5432/t1?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h", "t2"), "postgres://u@h/t2");
        assert_eq!(
            with_database("postgresql://h/db?options=-c%20x%3Dy", "t3"),
            "postgresql://h/t3?options=-c%20x%3Dy"
        );
    }
}
