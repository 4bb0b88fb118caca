//! JSON-RPC plumbing shared by every upstream transport: outgoing ids, the table
//! of requests awaiting replies, and the classification of incoming messages.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::{Arc, Mutex, PoisonError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use bytes::Bytes;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};

use crate::raw_object::RawObject;

/// What an upstream answered to a request, kept as sent.
#[derive(Clone, Debug)]
pub enum Reply {
    /// The `result` member.
    Result(Value),
    /// The `result` member unread, as the upstream wrote it: only for a request
    /// sent with [`crate::OutgoingRequest::result_unread`].
    Unread(RawObject),
    /// The `error` member: `{code, message, data?}`, relayed unchanged.
    Error(Value),
}

impl Reply {
    /// The reply, unless no MCP client could take it: every MCP result is an object,
    /// and an error is an object with an integer `code` and a string `message`
    /// (JSON-RPC 2.0). Relayed, such a reply would fail in the client's SDK with no
    /// word of which upstream sent it. (Not checked of plexus's own requests: a
    /// health ping's answer shows life whatever its shape.)
    pub fn checked(self) -> Result<Reply, ConnectionError> {
        let wrong = match &self {
            // Skimmed as an object.
            Reply::Unread(_) => None,
            Reply::Result(result) => {
                (!result.is_object()).then_some("its `result` is not an object")
            }
            Reply::Error(error) => {
                let code = error.get("code").is_some_and(Value::is_i64);
                let message = error.get("message").is_some_and(Value::is_string);
                (!(code && message)).then_some(
                    "its `error` is not an object with an integer `code` and a string `message`",
                )
            }
        };
        match wrong {
            None => Ok(self),
            Some(reason) => Err(ConnectionError::InvalidReply {
                reason: reason.into(),
            }),
        }
    }

    /// The reply with its result read, if it was not. Skimming checks less than
    /// reading (a lone surrogate escape passes it): a result that cannot be read
    /// is an error.
    pub fn try_read(self) -> Result<Reply, serde_json::Error> {
        match self {
            Reply::Unread(raw) => raw.read().map(Reply::Result),
            read => Ok(read),
        }
    }

    /// The result (read), or the error; a result that cannot be read is an error.
    pub fn into_result(self) -> Result<Value, Value> {
        match self {
            Reply::Result(result) => Ok(result),
            Reply::Unread(raw) => raw.read().map_err(|error| unreadable(&error)),
            Reply::Error(error) => Err(error),
        }
    }
}

/// The error object for a result plexus could skim but not read.
fn unreadable(error: &serde_json::Error) -> Value {
    serde_json::json!({
        "code": -32603,
        "message": format!("the upstream's result is not JSON plexus can read: {error}"),
    })
}

impl PartialEq for Reply {
    fn eq(&self, other: &Reply) -> bool {
        match (self, other) {
            (Reply::Error(a), Reply::Error(b)) => a == b,
            (Reply::Error(_), _) | (_, Reply::Error(_)) => false,
            (Reply::Result(a), Reply::Result(b)) => a == b,
            (Reply::Unread(a), Reply::Unread(b)) => a.bytes() == b.bytes(),
            (Reply::Result(a), Reply::Unread(b)) | (Reply::Unread(b), Reply::Result(a)) => {
                b.read().is_ok_and(|b| *a == b)
            }
        }
    }
}

/// Something an upstream sent that is not a reply to one of our requests.
#[derive(Clone, Debug, PartialEq)]
pub enum UpstreamEvent {
    /// A notification (`method`, no `id`), whole.
    Notification(Value),
    /// A server-to-client request (`method` and `id`), whole; answer with
    /// [`crate::UpstreamConnection::respond`].
    Request {
        message: Value,
        /// plexus's id of the request whose HTTP response stream carried this one:
        /// the upstream sent it while serving that request. `None` over stdio and
        /// on streams not tied to a request (the GET stream, HTTP+SSE).
        origin: Option<u64>,
    },
}

/// Decides, on the task that read a notification, whether to handle it there and
/// then; returns true if it did. What it handles reaches its destination before
/// any reply read after it (a call's last progress before the call's result).
pub type NotificationTap = Arc<dyn Fn(&Value) -> bool + Send + Sync>;

/// Where the messages an upstream sends on its own go: the tap first, if any,
/// then the queue of events.
#[derive(Clone)]
pub struct Events {
    queue: mpsc::Sender<UpstreamEvent>,
    tap: Option<NotificationTap>,
}

impl Events {
    pub fn new(queue: mpsc::Sender<UpstreamEvent>) -> Events {
        Events { queue, tap: None }
    }

    pub fn with_tap(mut self, tap: NotificationTap) -> Events {
        self.tap = Some(tap);
        self
    }

    /// Hands an event on, waiting for room in the queue.
    pub(crate) async fn deliver(&self, upstream: &str, event: UpstreamEvent) {
        if let (UpstreamEvent::Notification(message), Some(tap)) = (&event, &self.tap) {
            if tap(message) {
                return;
            }
        }
        if self.queue.send(event).await.is_err() {
            tracing::debug!(upstream, "no listener for upstream events");
        }
    }
}

impl From<mpsc::Sender<UpstreamEvent>> for Events {
    fn from(queue: mpsc::Sender<UpstreamEvent>) -> Events {
        Events::new(queue)
    }
}

/// What caused a failure, kept whole for [`crate::error_chain`]; shared, since
/// one failure fails every request waiting on the connection.
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// Why a request got no reply from the upstream. Shown to people through
/// [`crate::error_chain`], which adds the causes kept as sources.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("the connection to the upstream closed before it answered")]
    Closed,
    /// The connection was already closed: the request never left plexus.
    #[error("the connection to the upstream is closed")]
    NotSent,
    #[error("the upstream sent a message over the {limit}-byte limit")]
    TooLarge { limit: usize },
    /// The upstream answered the request with a message that is not JSON (its id
    /// could still be found at its start).
    #[error("the upstream's reply is not JSON")]
    Malformed {
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// The upstream answered the request with JSON that is not a JSON-RPC response.
    #[error("the upstream's reply is not a JSON-RPC response: {reason}")]
    InvalidReply { reason: String },
    /// An HTTP upstream answered with a status and no JSON-RPC reply.
    #[error("{url} answered HTTP {status}{}", detail_suffix(.detail))]
    HttpStatus {
        url: String,
        status: u16,
        detail: String,
        /// The `WWW-Authenticate` challenge of a 401 or 403: what an OAuth client
        /// needs to obtain a token (never shown: the detail says it for people).
        challenge: Option<String>,
    },
    /// An HTTP upstream could not be reached: the request never left plexus.
    #[error("the upstream could not be reached: {url}")]
    Unreachable {
        url: String,
        #[source]
        source: Cause,
    },
    /// The HTTP exchange carrying the request failed before its reply arrived.
    #[error("the HTTP exchange with {url} failed")]
    Broken {
        url: String,
        #[source]
        source: Cause,
    },
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

type ReplySender = oneshot::Sender<Result<Reply, ConnectionError>>;

/// A request awaiting its reply: where the reply goes, and whether its result
/// may stay unread.
struct Waiting {
    sender: ReplySender,
    unread: bool,
}

/// Requests sent upstream and not yet answered, keyed by the id plexus gave them.
#[derive(Default)]
pub(crate) struct PendingRequests {
    next_id: AtomicU64,
    waiting: Mutex<HashMap<u64, Waiting>>,
}

impl PendingRequests {
    pub(crate) fn register(&self) -> (u64, oneshot::Receiver<Result<Reply, ConnectionError>>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (sender, receiver) = oneshot::channel();
        self.lock().insert(
            id,
            Waiting {
                sender,
                unread: false,
            },
        );
        (id, receiver)
    }

    /// The reply to `id` may keep its result unread.
    pub(crate) fn leave_unread(&self, id: u64) {
        if let Some(waiting) = self.lock().get_mut(&id) {
            waiting.unread = true;
        }
    }

    fn wants_unread(&self, id: u64) -> bool {
        self.lock().get(&id).is_some_and(|waiting| waiting.unread)
    }

    /// Removes a request; true if it was still waiting (so a cancel is due).
    pub(crate) fn forget(&self, id: u64) -> bool {
        self.lock().remove(&id).is_some()
    }

    pub(crate) fn complete(&self, id: u64, outcome: Result<Reply, ConnectionError>) -> bool {
        match self.lock().remove(&id) {
            Some(waiting) => {
                // The caller may have given up meanwhile; the late reply is dropped.
                let _ = waiting.sender.send(outcome);
                true
            }
            None => false,
        }
    }

    /// Fails the request whose id starts `message`, a message from `upstream` that
    /// could not be read: its caller learns why now rather than at its deadline.
    /// The id failed; `None` if no request of ours is named there.
    pub(crate) fn fail_unreadable(
        &self,
        upstream: &str,
        message: &[u8],
        error: serde_json::Error,
    ) -> Option<u64> {
        let id = id_in_head(&message[..message.len().min(64)])?;
        let source = Arc::new(error);
        let failed = ConnectionError::Malformed {
            source: source.clone(),
        };
        if !self.complete(id, Err(failed)) {
            return None;
        }
        tracing::warn!(upstream, error = %source, "the upstream's reply is not JSON; its call failed");
        Some(id)
    }

    /// Fails the request a reply with neither `result` nor `error` names (its caller
    /// reports it); the id failed, `None` if no request of ours is named.
    pub(crate) fn fail_hollow(&self, upstream: &str, id: &Value) -> Option<u64> {
        let ours = our_id(id)?;
        let error = ConnectionError::InvalidReply {
            reason: "it has neither `result` nor `error`".into(),
        };
        if !self.complete(ours, Err(error)) {
            return None;
        }
        tracing::debug!(upstream, %id, "the upstream's reply has neither result nor error");
        Some(ours)
    }

    pub(crate) fn fail_all(&self, error: ConnectionError) {
        let drained: Vec<_> = self.lock().drain().collect();
        for (_, waiting) in drained {
            let _ = waiting.sender.send(Err(error.clone()));
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiting>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reads one message from an upstream. A reply whose request asked for its result
/// unread is only skimmed (its head names the request); anything else is parsed
/// whole. An error: not JSON.
pub(crate) fn read_message(
    bytes: Bytes,
    pending: &PendingRequests,
) -> Result<Incoming, serde_json::Error> {
    if let Some((id, reply)) = skim_reply(&bytes, pending) {
        return Ok(Incoming::Reply { id, reply });
    }
    serde_json::from_slice::<Value>(&bytes).map(classify)
}

/// An upstream's message with each lone surrogate escape in it made U+FFFD (see
/// `escapes`): unread or read, any client can then take it.
pub(crate) fn with_paired_surrogates(
    message: Bytes,
    upstream: &str,
    stats: &ConnectionStats,
) -> Bytes {
    let Some(repaired) = crate::escapes::repair_lone_surrogates(&message) else {
        return message;
    };
    if let Some(count) = count_sampled(&stats.lone_surrogates) {
        tracing::warn!(
            upstream,
            count,
            "the upstream escaped half a UTF-16 surrogate pair; relayed as U+FFFD"
        );
    }
    Bytes::from(repaired)
}

/// A reply (one message, nothing after it) to a request that asked for its result
/// unread: plexus's id and the unread result, which keeps `bytes` rather than a copy
/// of its part. `None` for anything else, and for a result that does not skim (not an
/// object, an empty one, a key with escapes): such a result is read.
pub(crate) fn skim_reply(bytes: &Bytes, pending: &PendingRequests) -> Option<(Value, Reply)> {
    let head = &bytes[..bytes.len().min(64)];
    if !id_in_head(head).is_some_and(|id| pending.wants_unread(id)) {
        return None;
    }
    let skimmed = crate::skim::object(bytes, Some("result"))?;
    let text = |range: &std::ops::Range<usize>| &bytes[range.clone()];
    let member = |name: &[u8]| {
        let mut named = skimmed.members.iter().filter(|(key, _)| text(key) == name);
        match (named.next(), named.next()) {
            (Some((_, value)), None) => Some(Some(value)),
            (None, _) => Some(None),
            // Named twice: a reader settles which one counts.
            (Some(_), Some(_)) => None,
        }
    };
    let (Some(id), None, Some(result)) = (member(b"id")?, member(b"method")?, member(b"result")?)
    else {
        return None;
    };
    let id = serde_json::from_slice::<Value>(text(id)).ok()?;
    if !our_id(&id).is_some_and(|id| pending.wants_unread(id)) {
        return None;
    }
    let members = skimmed.inner?;
    Some((
        id,
        Reply::Unread(RawObject::of(bytes, result.clone(), members)?),
    ))
}

/// Classifies one parsed message from an upstream.
pub(crate) enum Incoming {
    Reply {
        id: Value,
        reply: Reply,
    },
    Notification(Value),
    Request(Value),
    /// A JSON-RPC batch: its messages, each to classify in turn.
    Batch(Vec<Value>),
    /// A reply with neither `result` nor `error`: the request it names fails
    /// now rather than at its deadline.
    Hollow {
        id: Value,
    },
    Invalid,
}

pub(crate) fn classify(message: Value) -> Incoming {
    let mut object = match message {
        Value::Object(object) => object,
        Value::Array(batch) if !batch.is_empty() => return Incoming::Batch(batch),
        _ => return Incoming::Invalid,
    };
    let has_method = object.get("method").is_some_and(Value::is_string);
    let has_id = object.get("id").is_some_and(|id| !id.is_null());
    if has_method {
        return if has_id {
            Incoming::Request(Value::Object(object))
        } else {
            Incoming::Notification(Value::Object(object))
        };
    }
    let Some(id) = object.remove("id") else {
        return Incoming::Invalid;
    };
    if let Some(result) = object.remove("result") {
        Incoming::Reply {
            id,
            reply: Reply::Result(result),
        }
    } else if let Some(error) = object.remove("error") {
        Incoming::Reply {
            id,
            reply: Reply::Error(error),
        }
    } else if id.is_null() {
        Incoming::Invalid
    } else {
        Incoming::Hollow { id }
    }
}

pub(crate) fn encode_notification(method: &str, params: Option<Value>) -> Vec<u8> {
    let mut object = Map::with_capacity(3);
    object.insert("jsonrpc".into(), Value::from("2.0"));
    object.insert("method".into(), Value::from(method));
    if let Some(params) = params {
        object.insert("params".into(), params);
    }
    encode_line(&Value::Object(object))
}

pub(crate) fn encode_response(id: Value, reply: Reply) -> Vec<u8> {
    let mut object = Map::with_capacity(3);
    object.insert("jsonrpc".into(), Value::from("2.0"));
    object.insert("id".into(), id);
    match reply {
        Reply::Result(result) => object.insert("result".into(), result),
        Reply::Unread(raw) => match raw.read() {
            Ok(result) => object.insert("result".into(), result),
            Err(error) => object.insert("error".into(), unreadable(&error)),
        },
        Reply::Error(error) => object.insert("error".into(), error),
    };
    encode_line(&Value::Object(object))
}

fn encode_line(message: &Value) -> Vec<u8> {
    let mut bytes = crate::json_out::to_vec(message);
    bytes.push(b'\n');
    bytes
}

/// The id of one of our requests, as echoed by the upstream.
pub(crate) fn our_id(id: &Value) -> Option<u64> {
    match id {
        Value::Number(number) => number.as_u64(),
        // Some servers echo numeric ids back as strings.
        Value::String(text) => text.parse().ok(),
        _ => None,
    }
}

/// Finds the id of one of our requests at the start of a message that was too
/// large to parse (`{"jsonrpc":"2.0","id":12,...`); serializers put `id` first.
pub(crate) fn id_in_head(head: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(head).ok().or_else(|| {
        // The cut may fall inside a multi-byte character.
        let valid = std::str::from_utf8(head).err()?.valid_up_to();
        std::str::from_utf8(&head[..valid]).ok()
    })?;
    let after_key = &text[text.find("\"id\"")? + 4..];
    let value = after_key.trim_start().strip_prefix(':')?.trim_start();
    let value = value.strip_prefix('"').unwrap_or(value);
    let digits: String = value.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Counts one more of something an upstream did wrong; the count when it is one
/// to log: the first few, then every hundredth, so a chatty upstream cannot
/// flood the log.
pub(crate) fn count_sampled(counter: &AtomicU64) -> Option<u64> {
    let count = counter.fetch_add(1, Ordering::Relaxed) + 1;
    (count <= 5 || count.is_multiple_of(100)).then_some(count)
}

/// Counts one more of something that may come in a flood (a writer behind, a
/// hostile peer); the count when it is one to log: the first, then every
/// thousandth.
pub fn count_rarely(counter: &AtomicU64) -> Option<u64> {
    let count = counter.fetch_add(1, Ordering::Relaxed) + 1;
    (count == 1 || count.is_multiple_of(1000)).then_some(count)
}

pub(crate) type SharedPending = Arc<PendingRequests>;

/// Counters a connection keeps for metrics.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    /// Lines on stdout (or events on an HTTP stream) that were not JSON-RPC messages.
    pub dropped_stdout_lines: AtomicU64,
    /// Replies that arrived after their caller gave up.
    pub late_replies: AtomicU64,
    /// Messages with half a surrogate pair escaped, relayed with U+FFFD instead.
    pub lone_surrogates: AtomicU64,
    /// Processes started (or HTTP connections opened) with these counters.
    pub spawns: AtomicU64,
    /// Lines the upstream wrote on stderr, and how many of them the log left out.
    pub stderr_lines: AtomicU64,
    pub stderr_suppressed: AtomicU64,
}

/// What a transport hands the connection it becomes part of: the pending table,
/// the closed and stop tokens, the counters, and the transport itself.
pub(crate) struct Spawned<T> {
    pub upstream: Arc<str>,
    pub pending: SharedPending,
    pub closed: CancellationToken,
    pub stop: CancellationToken,
    pub stats: Arc<ConnectionStats>,
    /// Every task the connection started: its shutdown waits for them.
    pub tasks: TaskTracker,
    pub transport: T,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_result_stays_unread_only_for_a_request_that_asked() {
        let pending = PendingRequests::default();
        let (plain, _plain_reply) = pending.register();
        let (unread, _unread_reply) = pending.register();
        pending.leave_unread(unread);
        let reply =
            |id: u64| format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"b": 1, "a":[2]}}}}"#);

        let Ok(Incoming::Reply {
            id,
            reply: Reply::Unread(raw),
        }) = read_message(reply(unread).into(), &pending)
        else {
            panic!("the reply was read");
        };
        assert_eq!(our_id(&id), Some(unread));
        // As the upstream wrote it, spacing and order included.
        assert_eq!(raw.bytes(), br#"{"b": 1, "a":[2]}"#);
        assert_eq!(raw.member("a"), Some(&b"[2]"[..]));

        assert!(matches!(
            read_message(reply(plain).into(), &pending),
            Ok(Incoming::Reply { reply: Reply::Result(result), .. }) if result == json!({"b": 1, "a": [2]})
        ));
        // A request or an error under that id, and anything else, is read whole.
        let request = format!(r#"{{"jsonrpc":"2.0","id":{unread},"method":"roots/list"}}"#);
        assert!(matches!(
            read_message(request.into(), &pending),
            Ok(Incoming::Request(_))
        ));
        let error =
            format!(r#"{{"jsonrpc":"2.0","id":{unread},"error":{{"code":-1,"message":"m"}}}}"#);
        assert!(matches!(
            read_message(error.into(), &pending),
            Ok(Incoming::Reply {
                reply: Reply::Error(_),
                ..
            })
        ));
        assert!(read_message(Bytes::from_static(b"not json"), &pending).is_err());
        // Skimming lets a lone surrogate escape pass; reading it is an error.
        let lone = format!(r#"{{"jsonrpc":"2.0","id":{unread},"result":{{"t":"\ud800"}}}}"#);
        let Ok(Incoming::Reply { reply, .. }) = read_message(lone.into(), &pending) else {
            panic!("a skimmable reply was dropped");
        };
        assert!(matches!(reply.into_result(), Err(error) if error["code"] == -32603));
        // Unread or read, the same reply.
        assert_eq!(
            Reply::Unread(RawObject::skim(&br#"{"a":[1]}"#[..]).unwrap()),
            Reply::Result(json!({"a": [1]}))
        );
    }

    #[test]
    fn lone_surrogates_are_paired_and_an_unreadable_reply_fails_its_request() {
        let stats = ConnectionStats::default();
        let lone = Bytes::from_static(br#"{"id":1,"result":{"t":"\ud83d!"}}"#);
        let paired = with_paired_surrogates(lone, "u", &stats);
        assert_eq!(&paired[..], br#"{"id":1,"result":{"t":"\ufffd!"}}"#);
        assert_eq!(stats.lone_surrogates.load(Ordering::Relaxed), 1);
        let plain = Bytes::from_static(br#"{"id":1,"result":{"t":"\ud83d\ude00"}}"#);
        assert_eq!(with_paired_surrogates(plain.clone(), "u", &stats), plain);
        assert_eq!(stats.lone_surrogates.load(Ordering::Relaxed), 1);

        let pending = PendingRequests::default();
        let (id, mut reply) = pending.register();
        let broken = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"t":"\x"}}}}"#);
        let Err(error) = read_message(broken.clone().into(), &pending) else {
            panic!("read an invalid escape");
        };
        let unknown = b"{\"jsonrpc\":\"2.0\",\"id\":999}";
        assert_eq!(pending.fail_unreadable("u", unknown, error), None);
        let Err(error) = read_message(broken.clone().into(), &pending) else {
            panic!("read an invalid escape");
        };
        assert_eq!(
            pending.fail_unreadable("u", broken.as_bytes(), error),
            Some(id)
        );
        let failed = reply.try_recv();
        assert!(matches!(
            &failed,
            Ok(Err(error @ ConnectionError::Malformed { source }))
                if source.to_string().contains("escape")
                    && crate::error_chain(error).starts_with("the upstream's reply is not JSON: ")
        ));
        assert_eq!(pending.in_flight(), 0);
    }

    #[test]
    fn a_batch_is_classified_as_its_messages() {
        let batch = json!([{"jsonrpc": "2.0", "method": "notifications/message"}, {"jsonrpc": "2.0", "id": 3, "result": {}}]);
        let Incoming::Batch(messages) = classify(batch) else {
            panic!("a batch was not taken as one");
        };
        assert!(matches!(
            classify(messages[0].clone()),
            Incoming::Notification(_)
        ));
        assert!(matches!(
            classify(messages[1].clone()),
            Incoming::Reply { .. }
        ));
        assert!(matches!(classify(json!([])), Incoming::Invalid));
    }

    #[test]
    fn classifies_replies_events_and_garbage() {
        assert!(matches!(
            classify(json!({"jsonrpc":"2.0","id":3,"result":{"x":1}})),
            Incoming::Reply {
                reply: Reply::Result(_),
                ..
            }
        ));
        assert!(matches!(
            classify(json!({"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"m"}})),
            Incoming::Reply {
                reply: Reply::Error(_),
                ..
            }
        ));
        assert!(matches!(
            classify(json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"})),
            Incoming::Notification(_)
        ));
        assert!(matches!(
            classify(json!({"jsonrpc":"2.0","id":"s1","method":"roots/list"})),
            Incoming::Request(_)
        ));
        // A batch of things that are not messages: each is dropped in turn.
        let Incoming::Batch(batch) = classify(json!([1, 2])) else {
            panic!("not a batch");
        };
        assert!(batch
            .into_iter()
            .all(|m| matches!(classify(m), Incoming::Invalid)));
        // A reply that says nothing fails its request; without an id it names none.
        assert!(matches!(
            classify(json!({"jsonrpc":"2.0","id":1})),
            Incoming::Hollow { id } if id == json!(1)
        ));
        assert!(matches!(
            classify(json!({"jsonrpc":"2.0","id":null})),
            Incoming::Invalid
        ));
    }

    #[tokio::test]
    async fn pending_requests_complete_once_and_fail_together() {
        let pending = PendingRequests::default();
        let (first, first_rx) = pending.register();
        let (_second, second_rx) = pending.register();
        assert!(pending.complete(first, Ok(Reply::Result(json!(1)))));
        assert!(!pending.complete(first, Ok(Reply::Result(json!(2)))));
        pending.fail_all(ConnectionError::Closed);
        assert!(matches!(first_rx.await.unwrap(), Ok(Reply::Result(value)) if value == json!(1)));
        assert!(matches!(
            second_rx.await.unwrap(),
            Err(ConnectionError::Closed)
        ));
        assert_eq!(pending.in_flight(), 0);
    }

    #[test]
    fn ids_are_read_from_lines_and_values() {
        assert_eq!(our_id(&json!("12")), Some(12));
        assert_eq!(
            id_in_head(br#"{"jsonrpc":"2.0","id":42,"result":{"text":"xxxx"#),
            Some(42)
        );
        assert_eq!(id_in_head(br#"{"id" : "7","result""#), Some(7));
        assert_eq!(id_in_head(br#"{"jsonrpc":"2.0","result":{"#), None);
        assert_eq!(our_id(&json!(null)), None);
    }

    /// What an upstream's line becomes, checked: a read value writes back as JSON
    /// that reads the same; an unread result is the object its reader would see, and
    /// stays so with a member rewritten or cut.
    fn check_incoming(incoming: Incoming) -> bool {
        // Written as serde_json writes it, and readable again (serde_json's reading
        // of a float is not always the nearest one: values are not compared).
        let round_trip = |value: &Value| {
            let written = crate::json_out::to_vec(value);
            assert_eq!(written, serde_json::to_vec(value).unwrap());
            serde_json::from_slice::<Value>(&written).unwrap();
        };
        match incoming {
            Incoming::Reply { id, reply } => {
                round_trip(&id);
                match reply {
                    Reply::Result(value) | Reply::Error(value) => round_trip(&value),
                    Reply::Unread(raw) => {
                        // Its lone surrogates mended, an unread result reads.
                        let read = raw.read().unwrap();
                        let Value::Object(object) = &read else {
                            panic!("an unread result that is not an object")
                        };
                        let first = object.keys().next().unwrap().clone();
                        let mut rewritten = object.clone();
                        rewritten.insert(first.clone(), json!([true]));
                        let with = raw.with_member(&first, b"[true]").unwrap();
                        assert_eq!(with.read().unwrap(), Value::Object(rewritten));
                        let mut cut = object.clone();
                        cut.shift_remove(&first);
                        match raw.without_member(&first) {
                            Some(without) => {
                                assert_eq!(without.read().unwrap(), Value::Object(cut))
                            }
                            None => assert!(cut.is_empty()),
                        }
                        return true;
                    }
                }
            }
            Incoming::Notification(value) | Incoming::Request(value) => round_trip(&value),
            Incoming::Batch(batch) => batch.into_iter().for_each(|value| round_trip(&value)),
            Incoming::Hollow { id } => round_trip(&id),
            Incoming::Invalid => {}
        }
        false
    }

    #[test]
    fn hostile_upstream_lines_are_read_or_refused_and_never_panic() {
        let pending = PendingRequests::default();
        let _waits: Vec<_> = (0..3).map(|_| pending.register()).collect();
        (1..=3).for_each(|id| pending.leave_unread(id));
        let stats = ConnectionStats::default();
        let seeds: [&[u8]; 7] = [
            br#"{"jsonrpc":"2.0","id":1,"result":{"b": 1, "a":[2], "content":[{"type":"text","text":"x\u00e9"}]}}"#,
            br#"{"jsonrpc":"2.0","id":"1","result":{"t":"\ud83d\ude00","isError":false}}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":{"t":"\ud83d!"}}"#,
            br#"{"jsonrpc":"2.0","id":2,"error":{"code":-32601,"message":"m","data":null}}"#,
            br#"{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{"messages":[]}}"#,
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":0.5}}"#,
            br#"[{"jsonrpc":"2.0","id":3,"result":{}},{"jsonrpc":"2.0","id":1}]"#,
        ];
        let mut cases = mutations::cases(&seeds, 3_000, 0x0B57);
        for (index, seed) in seeds.iter().enumerate() {
            // Not the one with a lone surrogate: no reader takes it.
            if let Ok(seed) = serde_json::from_slice(seed) {
                cases.extend(mutations::value_mutants(&seed, 300, index as u64));
            }
        }
        let mut unread = 0;
        mutations::check("an upstream's line", &cases, 128, |line| {
            let line = with_paired_surrogates(Bytes::copy_from_slice(line), "u", &stats);
            let _ = id_in_head(&line[..line.len().min(256)]);
            if let Ok(incoming) = read_message(line, &pending) {
                unread += usize::from(check_incoming(incoming));
            }
        });
        // The skimmed path was taken too, not only the reader's.
        println!("{unread} results left unread");
        assert!(unread > 200, "{unread}");
    }
}
