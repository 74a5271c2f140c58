//! Reading a checkpoint back: the session head, the checkpoint row, its transcript and
//! the chain of seals between them, all from one snapshot.

use durable_core::StoreError;
use durable_core::ids::SessionId;
use durable_core::store::Checkpoint;

use crate::PostgresStore;
use crate::error::{corrupt, db};
use crate::rows::{self, get};
use crate::seal;
use crate::txn;

impl PostgresStore {
    pub(crate) async fn checkpoint(
        &self,
        id: &SessionId,
        version: Option<i64>,
    ) -> Result<Checkpoint, StoreError> {
        let ring = self.keyring();
        // One snapshot for every read: the head, the checkpoint and its transcript agree.
        let mut tx = txn::begin_snapshot(&self.pool).await?;
        let head = seal::checked_head(&mut tx, ring, id).await?;
        let v = version.unwrap_or(head.latest_version);
        // The previous version's seal, which this one's chains to, in the same round trip.
        let row = sqlx::query(
            "SELECT c.session_id, c.version, c.last_seq, c.message_count, c.app_version, \
                    c.created_at, c.plan, c.budget, c.state, c.format AS cp_format, c.seal, \
                    p.seal AS previous_seal, p.version IS NOT NULL AS previous_found \
             FROM durable_checkpoints c \
             LEFT JOIN durable_checkpoints p ON p.session_id = c.session_id \
                                            AND p.version = c.version - 1 \
             WHERE c.session_id = $1 AND c.version = $2",
        )
        .bind(id.as_str())
        .bind(v)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::VersionNotFound {
            session: id.clone(),
            version: v,
        })?;
        let meta = rows::checkpoint_meta(&row)?;
        let format: i32 = get(&row, "cp_format")?;
        rows::check_format(id, Some(v), "the checkpoint", format)?;
        let previous = if v > 0 {
            if !get::<bool>(&row, "previous_found")? {
                return Err(StoreError::Tampered {
                    session: id.clone(),
                    what: format!("checkpoint {}", v - 1),
                    detail: "it is missing".to_owned(),
                });
            }
            get::<Option<String>>(&row, "previous_seal")?.unwrap_or_default()
        } else {
            String::new()
        };
        let checkpoint_seal: Option<String> = get(&row, "seal")?;
        let texts: [String; 3] = [
            get(&row, "plan")?,
            get(&row, "budget")?,
            get(&row, "state")?,
        ];
        let plan = rows::json(id, Some(v), "the plan", &texts[0])?;
        let budget = rows::json(id, Some(v), "the budget", &texts[1])?;
        let state = rows::json(id, Some(v), "the state", &texts[2])?;
        let logged = sqlx::query(
            "SELECT seq, message, format, seal FROM durable_messages
             WHERE session_id = $1 AND seq <= $2 ORDER BY seq",
        )
        .bind(id.as_str())
        .bind(meta.last_seq)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        let mut messages = Vec::with_capacity(logged.len());
        // The chain: message n's seal covers message n-1's, from message 1 on.
        let mut chain = String::new();
        for (i, row) in logged.iter().enumerate() {
            let seq: i64 = get(row, "seq")?;
            if i64::try_from(i + 1).ok() != Some(seq) {
                return Err(StoreError::Tampered {
                    session: id.clone(),
                    what: format!("message {}", i + 1),
                    detail: format!("it is missing from the transcript (next is {seq})"),
                });
            }
            let what = format!("message {seq}");
            rows::check_format(id, Some(v), &what, get(row, "format")?)?;
            let text: String = get(row, "message")?;
            let stored: Option<String> = get(row, "seal")?;
            seal::check_message(ring, id, seq, &text, &chain, stored.as_deref())?;
            chain = stored.unwrap_or_default();
            messages.push(rows::json(id, Some(v), &what, &text)?);
        }
        if i64::try_from(logged.len()).ok() != Some(meta.last_seq) {
            return Err(StoreError::Tampered {
                session: id.clone(),
                what: format!("the transcript of checkpoint {v}"),
                detail: format!(
                    "it ends at message {} but the log holds {}",
                    meta.last_seq,
                    logged.len()
                ),
            });
        }
        seal::RawCheckpoint {
            session: id,
            version: v,
            last_seq: meta.last_seq,
            message_count: meta.message_count,
            last_message_seal: &chain,
            plan: &texts[0],
            budget: &texts[1],
            state: &texts[2],
            app_version: &meta.app_version,
            previous: &previous,
        }
        .check(ring, checkpoint_seal.as_deref())?;
        if messages.len() as i64 != meta.message_count {
            return Err(corrupt(
                id,
                Some(v),
                format!(
                    "the log holds {} messages up to seq {} but the checkpoint records {}; \
                     messages were deleted behind durable's back",
                    messages.len(),
                    meta.last_seq,
                    meta.message_count
                ),
            ));
        }
        Ok(Checkpoint {
            meta,
            messages,
            plan,
            budget,
            state,
        })
    }
}
