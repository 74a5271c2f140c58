//! `durable serve`: the operator console (the `durable-console` crate) over the store.
//!
//! The store is opened for writing, as `resolve` opens it. When only a read-only open
//! succeeds (a file this user may not write, a database user without write rights), or
//! with `--read-only`, the console is served read-only and says so on every form.

use std::net::SocketAddr;
use std::sync::Arc;

use durable_console::ConsoleOptions;

use crate::error::{CliError, Code};
use crate::open::{self, Location};
use crate::{Access, ServeArgs};

pub async fn serve(location: &Location, args: ServeArgs) -> Result<(), CliError> {
    if !args.bind.ip().is_loopback() && !args.allow_remote {
        return Err(CliError::new(
            Code::Usage,
            format!(
                "--bind {} is not a loopback address: the console would be reachable from other machines over plain HTTP; add --allow-remote to mean it",
                args.bind
            ),
        ));
    }
    let (opened, read_only) = if args.read_only {
        let opened = open::open(location, Access::Read, false).await?;
        (opened, Some("started with --read-only".to_owned()))
    } else {
        match open::open(location, Access::Write, false).await {
            Ok(opened) => (opened, None),
            // Refused for writing (e.g. a file we may not write): serve what can be read.
            Err(e) if e.code == Code::Unavailable => {
                match open::open(location, Access::Read, false).await {
                    Ok(opened) => {
                        eprintln!(
                            "warning: the store cannot be opened for writing ({}); serving it read-only",
                            crate::display::clip(&e.message, crate::display::LINE)
                        );
                        (
                            opened,
                            Some(format!(
                                "the store could not be opened for writing: {}",
                                e.message
                            )),
                        )
                    }
                    Err(_) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    };
    let mut options = ConsoleOptions::from_env().allow_remote(args.allow_remote);
    if let Some(by) = args.by {
        options = options.operator(by);
    }
    if let Some(reason) = read_only {
        options = options.read_only(reason);
    }
    let store = Arc::clone(&opened.shared);
    durable_console::serve(store, options, args.bind)
        .await
        .map_err(|e| {
            CliError::new(
                Code::Unavailable,
                format!("cannot serve the console on {}: {e}", args.bind),
            )
        })
}

/// `--bind`: an address and port, e.g. `127.0.0.1:7878` or `[::1]:7878`.
pub fn parse_bind(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|e| format!("{e}; expected an address and a port, e.g. 127.0.0.1:7878"))
}
