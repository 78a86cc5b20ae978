//! Connecting to a URL with the settings a lock client needs.

use crate::error::{Error, Result};
use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::{Config, ReconnectPolicy};
use fred::types::Builder;
use std::time::Duration;

/// A client for `url` with a reconnect policy and a command timeout.
pub(crate) async fn connect_client(url: &str, command_timeout: Duration) -> Result<Client> {
    let redis = |op, source| Error::Redis {
        key: String::new(),
        op,
        source,
    };
    let config = Config::from_url(url).map_err(|e| redis("parse url", e))?;
    let client = Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = command_timeout)
        .with_connection_config(|c| c.connection_timeout = Duration::from_secs(2))
        .set_policy(ReconnectPolicy::new_exponential(0, 10, 1000, 2))
        .build()
        .map_err(|e| redis("connect", e))?;
    // `init` resolves on the first connection attempt's outcome; if it fails the router task
    // is stopped, so nothing is left behind.
    match tokio::time::timeout(Duration::from_secs(5), client.init()).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) => Err(redis("connect", e)),
        Err(_) => {
            let _ = tokio::time::timeout(Duration::from_secs(1), client.quit()).await;
            Err(Error::Timeout {
                key: String::new(),
                op: "connect",
                after: Duration::from_secs(5),
            })
        }
    }
}
