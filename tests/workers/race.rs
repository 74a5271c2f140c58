//! Two worker processes resume one session at once, 200 times: exactly one proceeds, the
//! other gets the typed `Leased` error naming the winner; each session ends with exactly
//! versions 0 and 1, version 1 written by the winner.

use std::time::{Duration, Instant};

use durable::Message;
use durable::{Durable, SessionId, StartOptions};

use crate::backend::Backend;
use crate::proc::{Output, Worker};
use crate::worker::APP_VERSION;

const TRIALS: usize = 200;

pub async fn race(backend: Backend) {
    let started = Instant::now();
    let store = backend.store().await;
    let parent = Durable::builder(store.clone())
        .owner("race-parent")
        .app_version(APP_VERSION)
        .build();
    let ids: Vec<SessionId> = (0..TRIALS)
        .map(|i| SessionId::new(format!("race-{i:03}")))
        .collect();
    for id in &ids {
        let session = parent
            .start::<Message>(StartOptions::new().with_id(id.clone()))
            .await
            .expect("start");
        session.release().await.expect("release");
    }
    // A long lease: the winner keeps the session for the rest of the test.
    let ttl = Duration::from_secs(120);
    let mut twins = [
        Worker::spawn("race", &backend, "race-1", ttl, &[], Output::Lines),
        Worker::spawn("race", &backend, "race-2", ttl, &[], Output::Lines),
    ];
    for twin in &twins {
        assert_eq!(twin.line(Duration::from_secs(30)), "ready");
    }
    let mut wins = [0usize; 2];
    let mut winners = Vec::with_capacity(TRIALS);
    for id in &ids {
        // Both are blocked reading stdin: the two lines wake them together.
        for twin in &mut twins {
            twin.send(&format!("go {id}"));
        }
        let answers: Vec<String> = twins
            .iter()
            .map(|t| t.line(Duration::from_secs(30)))
            .collect();
        let won: Vec<usize> = (0..2)
            .filter(|&i| answers[i] == format!("won {id} 1"))
            .collect();
        assert_eq!(
            won.len(),
            1,
            "{id}: exactly one worker must proceed (at version 1): {answers:?}"
        );
        let (winner, loser) = (won[0], 1 - won[0]);
        assert_eq!(
            answers[loser],
            format!("leased {id} {}", twins[winner].owner),
            "{id}: the other must get the typed Leased error naming the holder"
        );
        wins[winner] += 1;
        winners.push(twins[winner].owner.clone());
    }
    for twin in &mut twins {
        twin.close_stdin();
        let status = twin.wait(Duration::from_secs(30));
        assert!(status.success(), "{} exited with {status}", twin.owner);
    }
    for (id, winner) in ids.iter().zip(&winners) {
        let versions: Vec<i64> = store
            .list_checkpoints(id)
            .await
            .expect("checkpoints")
            .iter()
            .map(|c| c.version)
            .collect();
        assert_eq!(
            versions,
            vec![0, 1],
            "{id}: contiguous versions, one written per trial"
        );
        let latest = store.load_checkpoint(id, Some(1)).await.expect("load v1");
        let last: Message = latest
            .messages
            .last()
            .expect("a message")
            .decode()
            .expect("message");
        assert_eq!(
            last.text(),
            format!("written by {winner}"),
            "{id}: version 1 is the winner's"
        );
    }
    println!(
        "race[{}]: trials={TRIALS} race-1 won {} race-2 won {} double_wins=0 ({:.1} s)",
        backend.name(),
        wins[0],
        wins[1],
        started.elapsed().as_secs_f64()
    );
}
