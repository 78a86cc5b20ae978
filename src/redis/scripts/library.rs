//! The scripts as one Redis Functions library: one `FUNCTION LOAD` per primary, called with
//! `FCALL`, and `EVALSHA` of the same texts where a server refuses `FUNCTION`.
//!
//! The library is assembled once per process from the same files the scripts are (nothing is
//! read from disk at run time): the queue layer once, then the lock's grammar and its calls in
//! one `do` block, the permits' in another, then the scripts that run on their own; each
//! call's script is a function of its own. Every function is defined once, when the library
//! loads: a call sets `KEYS` and `ARGV`, runs its family's start (`begin_lock`,
//! `begin_permits`: its arguments, nothing kept from the call before), then its script's text,
//! where a script builds all of the layer's functions again on every call. An `FCALL` and an
//! `EVALSHA` of the same call do the same thing to the same keys: clients that call either
//! serve one fleet together.
//!
//! Its name is `waitlock_<protocol>_<hash>` (the first 8 hex digits of the SHA-1 of its code),
//! and each function's is the library's then `_<script file's stem>`: Function names are
//! global to a server, so two versions (a rolling upgrade, or two builds whose scripts differ)
//! load side by side, each client calling its own, and a load with `REPLACE` is idempotent.
//!
//! Flags: the reading calls are `no-writes` (they run when the server is out of memory); the
//! calls that let go of, extend or give back what a caller holds are `allow-oom`, so that a full
//! server still lets a lock be released or kept (a Function without it is refused whole when
//! memory is full, where a script ran until its first write); acquiring stays refused then.

use super::super::Client;
use super::{LoadGate, LOCK_GRAMMAR, PERMITS_GRAMMAR, QUEUE_LAYER};
use fred::interfaces::{ClientLike, FunctionInterface};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// The protocol these scripts speak, which the library's name carries: 4, protocol 3's
/// formats (`lua/queue.lua`'s "format 3": keys, values and messages unchanged, so that a
/// protocol-3 client serves the same queues) with protocol 4's grant (docs/design.md, "The
/// grant (protocol 4)").
pub(crate) const PROTOCOL: u32 = 4;

/// A call of the library: its script file's stem (the function's name after the library's),
/// its text, and its flags.
struct Part {
    stem: &'static str,
    text: &'static str,
    flags: &'static str,
}

macro_rules! part {
    ($stem:literal, $flags:expr) => {
        Part {
            stem: $stem,
            text: include_str!(concat!("../lua/", $stem, ".lua")),
            flags: $flags,
        }
    };
}

/// Flags (inside the braces of `flags = {...}`): a call that only reads; one that lets go of,
/// extends or gives back what its caller holds; one that may write more (refused when memory
/// is full).
const READS: &str = "'no-writes'";
const WRITES: &str = "";
const LETS_GO: &str = "'allow-oom'";

/// The lock's calls: after the queue layer and `lock.lua`.
const LOCK: [Part; 8] = [
    part!("acquire", WRITES),
    part!("extend", LETS_GO),
    part!("release", LETS_GO),
    part!("leave", LETS_GO),
    part!("status", READS),
    part!("set_acquire", WRITES),
    part!("set_release", LETS_GO),
    part!("set_leave", LETS_GO),
];

/// The permits' calls: after the queue layer and `permits.lua`.
const PERMITS: [Part; 5] = [
    part!("permit_acquire", WRITES),
    part!("permit_extend", LETS_GO),
    part!("permit_release", LETS_GO),
    part!("permit_leave", LETS_GO),
    part!("permit_status", READS),
];

/// The scripts that run on their own.
const ALONE: [Part; 6] = [
    part!("refresh", LETS_GO),
    part!("take_set", WRITES),
    part!("give_back", LETS_GO),
    part!("elect_announce", WRITES),
    part!("elect_resign", LETS_GO),
    part!("elect_read", READS),
];

/// Where the library's name goes in its code before it is known.
const NAME: &str = "@LIBRARY@";

/// The library: its name and its code, for `FUNCTION LOAD`.
pub(crate) struct Library {
    pub(crate) name: String,
    pub(crate) code: String,
}

/// This process's library (assembled on first use).
pub(crate) fn library() -> &'static Library {
    static LIBRARY: LazyLock<Library> = LazyLock::new(assemble);
    &LIBRARY
}

/// The full name of the library's function for the script file `stem`.
pub(crate) fn function(stem: &str) -> String {
    format!("{}_{stem}", library().name)
}

/// One family's calls in a `do` block: its `grammar` (`lock.lua`, `permits.lua`) defined once,
/// then each call's script as a function of its own, registered to set the call's `KEYS` and
/// `ARGV` and run `begin` (the family's call start) before it.
fn family(out: &mut String, grammar: &str, begin: &str, calls: &[Part]) {
    out.push_str("do\n");
    out.push_str(grammar);
    for c in calls {
        out.push_str(&format!("\nlocal function call_{}()\n", c.stem));
        out.push_str(c.text);
        out.push_str("\nend\n");
    }
    for c in calls {
        register(out, c, begin);
    }
    out.push_str("end\n\n");
}

fn register(out: &mut String, c: &Part, begin: &str) {
    out.push_str(&format!(
        "redis.register_function{{function_name = '{NAME}_{stem}', callback = function(keys, argv) \
         KEYS, ARGV = keys, argv {begin} return call_{stem}() end, flags = {{{flags}}}}}\n",
        stem = c.stem,
        flags = c.flags,
    ));
}

fn assemble() -> Library {
    let mut body = String::from(
        "-- waitlock's scripts as one Redis Functions library, assembled from src/redis/lua/ by\n\
         -- src/redis/scripts/library.rs: every function below is defined once, when the library\n\
         -- loads; each call sets KEYS and ARGV, starts (`begin_lock`, `begin_permits`: nothing\n\
         -- kept from the call before), then runs its script's text as a function.\n\
         local KEYS, ARGV\n\n",
    );
    // The scripts that run on their own first: they see none of the layer's variables, as
    // they see none as scripts.
    for c in &ALONE {
        body.push_str(&format!("local function call_{}()\n", c.stem));
        body.push_str(c.text);
        body.push_str("\nend\n");
    }
    for c in &ALONE {
        register(&mut body, c, "");
    }
    body.push_str(QUEUE_LAYER);
    family(&mut body, LOCK_GRAMMAR, "begin_lock()", &LOCK);
    family(&mut body, PERMITS_GRAMMAR, "begin_permits()", &PERMITS);
    let hash = fred::util::sha1_hash(&body);
    let name = format!("waitlock_{PROTOCOL}_{}", &hash[..8]);
    let code = format!("#!lua name={name}\n{}", body.replace(NAME, &name));
    Library { name, code }
}

/// How long a refusal of Functions holds before an engine asks again (an ACL fixed, a Cluster
/// whose last node was upgraded), and how long after a load that failed otherwise (a timeout, a
/// server that would not compile it) the calls that find the library missing run as scripts
/// without sending it again.
const ASK_AGAIN: Duration = Duration::from_secs(300);
const LOAD_AGAIN: Duration = Duration::from_secs(1);

/// How an engine calls its scripts, and its loads of the library.
pub(crate) struct Loader {
    born: Instant,
    /// Until when (ms after `born`) calls go by `EVALSHA`: the server refused `FUNCTION LOAD`
    /// or `FCALL` (an ACL without them, a proxy or managed service without them). 0: never.
    refused_until: AtomicU64,
    /// Until when (ms after `born`) a call that finds the library missing runs as a script
    /// without loading it: the last load failed.
    failed_until: AtomicU64,
    /// Its loads of the library: the calls in flight that meet "not found" together (after a
    /// restart, a flush, on a new node) wait for one load.
    loads: LoadGate,
    /// A load is in progress (calls about to be sent wait for it: [`Loader::settled`]).
    loading: AtomicBool,
}

impl Default for Loader {
    fn default() -> Loader {
        Loader {
            born: Instant::now(),
            refused_until: AtomicU64::new(0),
            failed_until: AtomicU64::new(0),
            loads: LoadGate::default(),
            loading: AtomicBool::new(false),
        }
    }
}

/// What a load came to.
pub(crate) enum Load {
    /// Loaded (by this call or another since it looked): call again.
    Loaded,
    /// The server refused Functions: scripts for a while ([`ASK_AGAIN`]).
    Refused,
    /// Not now (out of memory, a timeout, an error): this call runs as a script.
    NotNow,
}

impl Loader {
    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64 + 1
    }

    /// Whether calls go by `FCALL` (not while a refusal holds).
    pub(crate) fn functions(&self) -> bool {
        self.now_ms() >= self.refused_until.load(Ordering::Acquire)
    }

    /// The loads so far, read before a call: a later load makes this call's own needless.
    pub(crate) fn seen(&self) -> u64 {
        self.loads.seen()
    }

    /// Waits for a load in progress, if any: a call sent now would find the library missing
    /// too (the calls already in flight when it went missing do).
    pub(crate) async fn settled(&self) {
        if self.loading.load(Ordering::Acquire) {
            self.loads.settled().await;
        }
    }

    /// The server refused Functions (`why`): scripts for [`ASK_AGAIN`] (said once as a
    /// warning, later refusals at debug level).
    pub(crate) fn refuse(&self, why: &fred::error::Error) {
        let until = self.now_ms() + ASK_AGAIN.as_millis() as u64;
        if self.refused_until.swap(until, Ordering::AcqRel) == 0 {
            tracing::warn!(
                error = %why,
                "waitlock: the server refused Redis Functions; calling the same scripts by EVALSHA"
            );
        } else {
            tracing::debug!(error = %why, "waitlock: the server refused Redis Functions again");
        }
    }

    /// Loads the library (on every primary of a cluster, with `REPLACE`: the same name is the
    /// same code) unless another call loaded it after `seen`, or Functions were refused, or a
    /// load failed within [`LOAD_AGAIN`]; waits for a load in progress.
    pub(crate) async fn load(&self, client: &Client, seen: u64) -> Load {
        let Some(_gate) = self.loads.enter(seen).await else {
            return Load::Loaded;
        };
        if !self.functions() {
            return Load::Refused;
        }
        if self.now_ms() < self.failed_until.load(Ordering::Acquire) {
            return Load::NotNow;
        }
        self.loading.store(true, Ordering::Release);
        let code = library().code.as_str();
        let sent = if client.is_clustered() {
            client
                .function_load_cluster::<fred::types::Value, _>(true, code)
                .await
                .map(drop)
        } else {
            client
                .function_load::<String, _>(true, code)
                .await
                .map(drop)
        };
        self.loading.store(false, Ordering::Release);
        match sent {
            Ok(()) => {
                self.loads.count();
                Load::Loaded
            }
            Err(e) if refuses_functions(&e) => {
                self.refuse(&e);
                Load::Refused
            }
            Err(e) => {
                let until = self.now_ms() + LOAD_AGAIN.as_millis() as u64;
                self.failed_until.store(until, Ordering::Release);
                tracing::warn!(error = %e, "waitlock: the library could not be loaded; calling the scripts");
                Load::NotNow
            }
        }
    }
}

/// At connect, on a single server: loads the library if the server does not have it (one
/// `FUNCTION LIST`; a fleet starting together loads it a few times at most, each the same
/// code), so that the first calls find it. Best effort, both within `limit`: whatever this meets (an
/// ACL without `FUNCTION`, a timeout), the first call decides again (loads it, or calls the
/// scripts). A Cluster's nodes load it when a call first finds it missing there.
pub(crate) async fn preload(client: &Client, limit: Duration) {
    if client.is_clustered() {
        return;
    }
    let lib = library();
    let ensure = async {
        let found: fred::types::Value =
            client.function_list(Some(lib.name.as_str()), false).await?;
        if matches!(&found, fred::types::Value::Array(libs) if libs.is_empty()) {
            client
                .function_load::<String, _>(true, lib.code.as_str())
                .await?;
        }
        Ok::<(), fred::error::Error>(())
    };
    if let Ok(Err(e)) = tokio::time::timeout(limit, ensure).await {
        tracing::debug!(error = %e, "waitlock: the library was not loaded at connect");
    }
}

/// The server has no such function: it never loaded the library, or lost it (a restart
/// without persistence, `FUNCTION FLUSH`, a node that joined without it).
pub(crate) fn missing_function(e: &fred::error::Error) -> bool {
    e.details().contains("Function not found")
}

/// The server does not let this client use Functions: an ACL without `FUNCTION LOAD` or
/// `FCALL`, a server or proxy without the commands ("unknown", "unsupported"). (A command the
/// function runs that the ACL refuses is refused to the script too: not this.)
pub(crate) fn refuses_functions(e: &fred::error::Error) -> bool {
    let d = e.details().to_ascii_lowercase();
    (d.starts_with("noperm") && (d.contains("'fcall'") || d.contains("'function")))
        || d.contains("unknown command")
        || d.contains("unknown subcommand")
        || d.contains("unsupported command")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_is_registered_once_with_its_flags() {
        let lib = library();
        assert!(lib.name.starts_with(&format!("waitlock_{PROTOCOL}_")));
        assert!(lib.code.starts_with(&format!("#!lua name={}\n", lib.name)));
        assert!(!lib.code.contains(NAME));
        for c in LOCK.iter().chain(&PERMITS).chain(&ALONE) {
            let reg = format!("function_name = '{}'", function(c.stem));
            assert_eq!(lib.code.matches(&reg).count(), 1, "{}", c.stem);
        }
        let flagged = |f: &str| lib.code.matches(&format!("flags = {{{f}}}}}")).count();
        assert_eq!(flagged(READS), 3);
        assert_eq!(flagged(LETS_GO), 11);
        assert_eq!(flagged(WRITES), 5);
    }
}
