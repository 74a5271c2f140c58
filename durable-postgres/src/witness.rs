//! Noticing a restored or swapped database: the store records which database it lives in,
//! by facts a restore cannot bring back.
//!
//! Every row of the database, seals included, comes back consistent from a backup, so
//! nothing stored in it can tell that it was restored. What a restore cannot restore is
//! the identity of the place it lands in. A writer's open records, in `durable_meta`,
//! where the store lives:
//!
//! - the cluster's **system identifier** (`pg_control_system()`): new for a database
//!   restored into another cluster, a new instance, a re-initialized server;
//! - the **timeline** it writes on (the first part of the current WAL file's name): new
//!   after a point-in-time recovery and after a replica is promoted;
//! - the **database's OID** and the **OID of `durable_meta` itself**: new when the
//!   database is dropped and recreated, and whenever a dump is restored (`pg_restore`
//!   creates its tables afresh), into this server or any other.
//!
//! A writer that opens the store where any of them differs from what was recorded
//! refuses with [`StoreError::RolledBack`]: writes acknowledged before the switch may be
//! missing, and the effects they recorded would run again. `durable
//! acknowledge-rollback` (or [`PostgresStore::acknowledge_rollback`]) parks every
//! unfinished session, unless the operator states that nothing was lost (`--intact`,
//! e.g. a planned switchover with synchronous replication), audits the decision, and
//! records the new place.
//!
//! What it cannot catch: a file-system snapshot of the whole cluster put back without a
//! point-in-time recovery (same cluster, same timeline, same OIDs), and an attacker who
//! rewrites the recorded row. Running workers check at open only: restart them after a
//! failover, and each refuses until the switch is acknowledged.
//!
//! [`PostgresStore::acknowledge_rollback`]: crate::PostgresStore::acknowledge_rollback

use durable_core::StoreError;
use sqlx::PgConnection;

use crate::error::db;

/// The `durable_meta` row holding where the store lives.
const META: &str = "placement";

/// Where a store lives, as PostgreSQL tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    system: String,
    timeline: String,
    database: String,
    table: String,
}

impl Placement {
    fn encode(&self) -> String {
        format!(
            "v1 {} {} {} {}",
            self.system, self.timeline, self.database, self.table
        )
    }

    fn decode(text: &str) -> Option<Self> {
        match text.split(' ').collect::<Vec<_>>().as_slice() {
            ["v1", system, timeline, database, table] => Some(Placement {
                system: (*system).to_owned(),
                timeline: (*timeline).to_owned(),
                database: (*database).to_owned(),
                table: (*table).to_owned(),
            }),
            _ => None,
        }
    }

    /// What changed between `was` and `self`, in words an operator acts on.
    fn changes(&self, was: &Placement) -> Vec<String> {
        let mut out = Vec::new();
        if self.system != was.system {
            out.push(format!(
                "the cluster changed (system identifier {} → {}: restored into another server or instance, or the server was re-initialized)",
                was.system, self.system
            ));
        }
        if self.timeline != was.timeline {
            out.push(format!(
                "the timeline changed ({} → {}: a point-in-time recovery, or a replica was promoted)",
                was.timeline, self.timeline
            ));
        }
        if self.database != was.database || self.table != was.table {
            out.push(
                "the database or its tables were recreated (a dump restored with pg_restore, or the store copied into another database)"
                    .to_owned(),
            );
        }
        out
    }
}

/// Reads where the store lives now.
pub(crate) async fn current(conn: &mut PgConnection) -> Result<Placement, StoreError> {
    let (system, timeline, database, table): (String, String, String, String) = sqlx::query_as(
        "SELECT (SELECT system_identifier::text FROM pg_control_system()), \
         CASE WHEN pg_is_in_recovery() \
              THEN lpad(upper(to_hex((SELECT timeline_id FROM pg_control_checkpoint()))), 8, '0') \
              ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END, \
         (SELECT oid::text FROM pg_database WHERE datname = current_database()), \
         'durable_meta'::regclass::oid::text",
    )
    .fetch_one(conn)
    .await
    .map_err(db)?;
    Ok(Placement {
        system,
        timeline,
        database,
        table,
    })
}

/// What a writer's open found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlacementReport {
    /// What changed since the store was last opened, in words; empty when nothing did.
    pub changes: Vec<String>,
}

impl PlacementReport {
    /// Whether the database was found restored or swapped.
    pub fn rolled_back(&self) -> bool {
        !self.changes.is_empty()
    }
}

/// Compares where the store lives with what was recorded, writing nothing (for a
/// read-only store: `durable verify`).
pub(crate) async fn inspect(conn: &mut PgConnection) -> Result<PlacementReport, StoreError> {
    let now = current(&mut *conn).await?;
    let recorded: Option<String> =
        sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = $1")
            .bind(META)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
    Ok(match recorded.as_deref().map(Placement::decode) {
        Some(Some(was)) => PlacementReport {
            changes: now.changes(&was),
        },
        Some(None) => PlacementReport {
            changes: vec![format!(
                "the recorded placement (`durable_meta.{META}`) is unreadable: it was edited"
            )],
        },
        None => PlacementReport::default(),
    })
}

/// Checks (and, the first time, records) where the store lives, in the open's
/// transaction. With `acknowledge`, records the new place instead of refusing it.
pub(crate) async fn check(
    conn: &mut PgConnection,
    location: &str,
    acknowledge: bool,
) -> Result<PlacementReport, StoreError> {
    let now = current(&mut *conn).await?;
    let recorded: Option<String> =
        sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = $1")
            .bind(META)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
    let report = match recorded.as_deref().map(Placement::decode) {
        Some(Some(was)) => PlacementReport {
            changes: now.changes(&was),
        },
        Some(None) => PlacementReport {
            changes: vec![format!(
                "the recorded placement (`durable_meta.{META}`) is unreadable: it was edited"
            )],
        },
        None => PlacementReport::default(),
    };
    if report.rolled_back() && !acknowledge {
        return Err(StoreError::RolledBack {
            location: location.to_owned(),
            detail: format!(
                "{}. Writes acknowledged before the switch may be missing, and the effects they recorded would run again. Stop every worker; if the old database still exists, point the workers back at it; otherwise run `durable acknowledge-rollback --db <url>`, which parks every unfinished session for a person to check (add `--intact` only if you know nothing was lost, e.g. a planned switchover with synchronous replication)",
                report.changes.join("; ")
            ),
        });
    }
    if recorded.is_none() || report.rolled_back() {
        sqlx::query(
            "INSERT INTO durable_meta (name, value) VALUES ($1, $2) \
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        )
        .bind(META)
        .bind(now.encode())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_round_trip_and_name_what_changed() {
        let was = Placement {
            system: "1".into(),
            timeline: "00000001".into(),
            database: "5".into(),
            table: "16384".into(),
        };
        assert_eq!(Placement::decode(&was.encode()), Some(was.clone()));
        assert!(was.changes(&was).is_empty());
        let promoted = Placement {
            timeline: "00000002".into(),
            ..was.clone()
        };
        let changes = promoted.changes(&was);
        assert_eq!(changes.len(), 1);
        assert!(changes[0].contains("promoted"), "{changes:?}");
        let restored = Placement {
            table: "24576".into(),
            ..was.clone()
        };
        assert!(restored.changes(&was)[0].contains("pg_restore"));
        assert_eq!(Placement::decode("garbage"), None);
    }
}
