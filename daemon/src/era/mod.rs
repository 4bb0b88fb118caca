//! The era layer: which revision a request speaks ([`Era`], decided once by its
//! front) and everything that differs between the two. A request crosses it once
//! on the way out ([`to_upstream`], called by `Hub::forward`) and its answer once on
//! the way back to the client ([`answer`], called where the session answers), a
//! relayed reply being given the client's era's shape just before ([`relayed`]).
//! The wire rules are in `wire`, the fields bridged between eras in `fields`, the
//! task shapes in `tasks`, a request paused on its client's input in `bridge`.

pub mod bridge;
mod fields;
pub mod tasks;
mod wire;

use std::sync::Arc;

use adapters::Reply;
use serde_json::Value;

use crate::jsonrpc::{self, RelayError};
use crate::logging::LogLevel;

pub use fields::{answering_as_plexus, is_complete, mint_elicitation_id, to_input_request};
pub use wire::{
    check_meta, declared_version, discover_result, mirrored_name, tag_subscription, take_meta,
    ALL_VERSIONS, META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_SUBSCRIPTION_ID, MODERN_VERSION,
    TASKS_EXTENSION,
};

/// Which revision a client speaks, decided once where its request arrives (a
/// front, or a scope's creation) and carried down to the code that answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Era {
    /// `initialize` once, then a session (2024-11-05 to 2025-11-25).
    Handshake,
    /// 2026-07-28: no handshake; every request declares its version in `_meta`.
    Modern,
}

impl Era {
    /// The era of a message arriving in a session: a client that never
    /// initialized and declares a version per request (or asks `server/discover`)
    /// speaks 2026-07-28.
    pub fn of_message(initialized: bool, message: &Value) -> Era {
        let modern = !initialized
            && (message.get("method").and_then(Value::as_str) == Some("server/discover")
                || declared_version(message.get("params")).is_some());
        if modern {
            Era::Modern
        } else {
            Era::Handshake
        }
    }
}

/// The per-request context a 2026-07-28 client sends in `_meta`.
#[derive(Clone, Debug)]
pub struct RequestMeta {
    pub capabilities: Arc<Value>,
    pub log_level: Option<LogLevel>,
}

/// The way out: a request's params as its upstream's era must see them. The
/// client's own per-request fields are stripped (an upstream negotiated its
/// revision once); a 2026-07-28 upstream (`relayed`: the capabilities plexus
/// relays for the calling client, given only for one) is told what that client
/// can do, not what plexus can, so it may refuse a tool the client could not
/// serve (-32021).
pub fn to_upstream(method: &str, params: &mut Option<Value>, relayed: Option<Value>) {
    fields::strip_request_meta(params);
    if let Some(mut capabilities) = relayed {
        // A handshake-era client's task (its `task` parameter, or a task method
        // on a task it created) is the tasks extension to this upstream.
        if fields::handshake_task_request(method, params) {
            fields::declare_tasks_extension(&mut capabilities);
        }
        fields::set_client_capabilities(params, capabilities);
    }
}

/// The way back: the answer to request `id` as a client of `era` must see it. A
/// 2026-07-28 client's result names its type (and a cacheable one its lifetime),
/// and an upstream's error loses the codes that revision retired; a result that
/// came unread stays so when only its type is added.
pub fn answer(era: Era, method: &str, id: Value, reply: Reply) -> jsonrpc::Answer {
    let modern = era == Era::Modern;
    match reply {
        Reply::Unread(raw) => {
            let marked = if modern {
                wire::mark_complete_unread(method, &raw)
            } else {
                Some([raw.bytes(), b""])
            };
            match marked {
                Some(parts) => {
                    jsonrpc::Answer::result_written(&id, parts[0].len() + parts[1].len(), |out| {
                        parts.iter().for_each(|part| out.extend_from_slice(part))
                    })
                }
                None => match Reply::Unread(raw).into_result() {
                    Ok(mut result) => {
                        wire::mark_complete(method, &mut result);
                        jsonrpc::result_response(id, result).into()
                    }
                    Err(error) => jsonrpc::error_object_response(id, error).into(),
                },
            }
        }
        Reply::Result(mut result) => {
            if modern {
                wire::mark_complete(method, &mut result);
            }
            jsonrpc::result_response(id, result).into()
        }
        Reply::Error(mut error) => {
            if modern {
                fields::modern_upstream_error(&mut error);
            }
            jsonrpc::error_object_response(id, error).into()
        }
    }
}

/// The way back for a relayed reply, before plexus answers with it ([`answer`]):
/// what the client's era lacks is taken out, what it shapes otherwise is
/// reshaped. A handshake-era client's result loses `resultType: complete` and the
/// `serverInfo` in its `_meta`, and a tool call's task takes the client's era's form
/// (`tasks::created`, `tasks::nested`).
pub fn relayed(era: Era, method: &str, mut reply: Reply) -> Reply {
    if era == Era::Handshake {
        fields::without_complete_type(&mut reply);
        fields::without_server_info(&mut reply);
    }
    if method != "tools/call" {
        return reply;
    }
    match era {
        Era::Modern => tasks::created(reply),
        Era::Handshake => tasks::nested(reply),
    }
}

/// plexus's own error for request `id`, in the client's era.
pub fn refusal(era: Era, id: Value, error: &RelayError) -> jsonrpc::Answer {
    let error = if era == Era::Modern {
        error.to_modern_error_object()
    } else {
        error.to_error_object()
    };
    jsonrpc::error_object_response(id, error).into()
}
