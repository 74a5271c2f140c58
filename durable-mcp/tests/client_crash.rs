//! The client side killed mid-call: a durable agent (`examples/mcp_client.rs agent`)
//! calling the example server's tools over streamable HTTP through `RemoteTools`, killed
//! (SIGKILL) while the server's tool body waits at the gate after its effect, then
//! resumed. Effects counted in the ledger, outside both processes.

mod common;

use std::process::Output;
use std::time::Duration;

use common::{Transport, World, example};
use durable::store::Resolution;
use serde_json::json;
use tokio::process::Command;

struct Agent<'w> {
    world: &'w World,
    url: String,
    session: &'static str,
    tool: &'static str,
}

impl Agent<'_> {
    fn command(&self) -> Command {
        let mut command = Command::new(example("mcp_client"));
        command
            .arg("agent")
            .arg("--store")
            .arg(self.world.dir.path().join("agent.db"))
            .args([
                "--url",
                &self.url,
                "--session",
                self.session,
                "--tool",
                self.tool,
            ])
            .kill_on_drop(true);
        command
    }

    async fn run(&self) -> Output {
        tokio::time::timeout(Duration::from_secs(120), self.command().output())
            .await
            .expect("the agent finishes")
            .expect("run the agent")
    }

    /// Starts the agent, waits until the server's tool wrote its effect, kills the agent.
    async fn crash(&self) {
        let mut child = self.command().spawn().expect("spawn the agent");
        self.world.reached(self.tool).await;
        child.kill().await.expect("kill the agent");
    }
}

async fn http_server(world: &World) -> (common::Server, String) {
    let server = world.server(Transport::Http, true).await;
    // The harness's own client connected; the agent connects to the same address.
    let url = server_url(&server);
    (server, url)
}

fn server_url(server: &common::Server) -> String {
    server.url.clone().expect("an HTTP server")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// An unsafe call in flight when the agent died is in doubt on resume (refused, nothing
/// sent again); after the operator resolves it, the agent continues with that result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_remote_call_in_doubt_after_the_agent_died() {
    let world = World::new();
    let (server, url) = http_server(&world).await;
    let agent = Agent {
        world: &world,
        url,
        session: "agent-email",
        tool: "send_email",
    };
    agent.crash().await;
    world.release();

    let resumed = agent.run().await;
    assert_eq!(
        resumed.status.code(),
        Some(3),
        "refused as in doubt: {}",
        stdout(&resumed)
    );
    let out = stdout(&resumed);
    let call = out
        .trim()
        .strip_prefix("in doubt: ")
        .expect("names the call")
        .to_owned();
    assert_eq!(world.effects("email").await, 1);

    // The agent's own store: the operator resolves the agent's row.
    let agent_store = durable::connect(&format!(
        "sqlite:{}",
        world.dir.path().join("agent.db").display()
    ))
    .await
    .expect("agent store");
    durable::Durable::builder(agent_store)
        .owner("operator")
        .build()
        .operator()
        .resolve(
            &durable::CallId::new(call),
            Resolution::Happened {
                result: json!({"message_id": 1}),
            },
            "test",
            None,
        )
        .await
        .expect("resolve");
    let done = agent.run().await;
    assert_eq!(done.status.code(), Some(0), "{}", stdout(&done));
    assert!(
        stdout(&done).contains(r#"{"message_id":1}"#),
        "{}",
        stdout(&done)
    );
    assert_eq!(
        world.effects("email").await,
        1,
        "one email, whatever happened to the agent"
    );
    server.kill().await;
}

/// A keyed call in flight when the agent died is re-executed on resume with the same
/// durable call id in `_meta`: the durable server returns the first attempt's recorded
/// result, so the charge body ran once on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_remote_call_reexecuted_once_end_to_end() {
    let world = World::new();
    let (server, url) = http_server(&world).await;
    let agent = Agent {
        world: &world,
        url,
        session: "agent-charge",
        tool: "charge",
    };
    agent.crash().await;
    world.release();

    let resumed = agent.run().await;
    assert_eq!(resumed.status.code(), Some(0), "{}", stdout(&resumed));
    assert!(
        stdout(&resumed).contains("charge:o-99"),
        "{}",
        stdout(&resumed)
    );
    assert_eq!(world.effects("charge").await, 1);
    assert_eq!(
        world.effects("charge_attempt").await,
        1,
        "the re-executed call carried the same call id, and the server replayed it"
    );
    server.kill().await;
}

/// The server killed under a running agent: the remote call's outcome is unknown, so the
/// agent's call is left in doubt (refused, not recorded as a failure the model would
/// retry), and stays so after the server's restart; one email.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_under_the_agent_leaves_its_call_in_doubt() {
    let world = World::new();
    let (server, url) = http_server(&world).await;
    let mut agent = Agent {
        world: &world,
        url,
        session: "agent-lost",
        tool: "send_email",
    };
    let child = agent
        .command()
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the agent");
    world.reached("send_email").await;
    server.kill().await;
    let lost = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the agent notices the lost server")
        .expect("agent output");
    assert_eq!(
        lost.status.code(),
        Some(3),
        "left in doubt: {}",
        stdout(&lost)
    );
    assert!(stdout(&lost).starts_with("in doubt: "), "{}", stdout(&lost));

    let server = world.server(Transport::Http, false).await;
    agent.url = server_url(&server);
    let resumed = agent.run().await;
    assert_eq!(
        resumed.status.code(),
        Some(3),
        "still in doubt: {}",
        stdout(&resumed)
    );
    assert_eq!(world.effects("email").await, 1);
    server.kill().await;
}
