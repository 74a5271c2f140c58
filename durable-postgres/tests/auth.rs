//! A wrong password is reported as the server's message, its SQLSTATE and nothing else:
//! not with sqlx's `at line N` (the line of the server's C source that raised it), and
//! never with the password. The throwaway cluster has one role that logs in with SCRAM
//! (`testing::password_role`).

use durable_core::StoreError;
use durable_postgres::PostgresStore;
use durable_postgres::testing::{PASSWORD_ROLE, password_role, test_database};

#[tokio::test]
async fn a_wrong_password_is_the_servers_message_without_its_source_line() {
    let db = test_database().await;
    let url = match password_role(&db, "right-horse-battery").await {
        Ok(url) => url,
        // Against DATABASE_URL this harness cannot set authentication up.
        Err(why) => return eprintln!("{why}"),
    };
    let with =
        |password: &str| url.replacen(PASSWORD_ROLE, &format!("{PASSWORD_ROLE}:{password}"), 1);

    let store = PostgresStore::connect(&with("right-horse-battery"))
        .await
        .expect("the right password opens the store");
    store.pool().close().await;

    let error = PostgresStore::connect(&with("wrong-staple"))
        .await
        .expect_err("a wrong password is refused");
    assert!(matches!(error, StoreError::Database { .. }), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "password authentication failed for user \"{PASSWORD_ROLE}\""
        )),
        "{text}"
    );
    assert!(text.contains("SQLSTATE 28P01"), "{text}");
    assert!(
        !text.contains(" at line "),
        "the server's source line: {text}"
    );
    assert!(!text.contains("wrong-staple"), "the password: {text}");
}
