//! The cluster's key ring: tokens naming a node (session ids, paused rounds'
//! `requestState`, an upstream's own `requestState` and task ids bound to the
//! principal given them, node-to-node requests), signed with HMAC-SHA256 under the
//! current secret and accepted under any secret still in the ring, so keys rotate
//! without ending sessions.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::hmac;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

const VERSION: u8 = 1;
const KEY_ID: usize = 4;
const NONCE: usize = 16;
/// 128 bits of the HMAC: forging one takes 2^128 tries.
const TAG: usize = 16;

/// What a token is for: a token made for one purpose never passes for another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Session,
    State,
    Task,
    Peer,
}

impl Purpose {
    fn label(self) -> &'static [u8] {
        match self {
            Purpose::Session => b"plexus session id",
            Purpose::State => b"plexus request state",
            Purpose::Task => b"plexus task id",
            Purpose::Peer => b"plexus peer request",
        }
    }
}

/// Why a token was refused; none says more than that to the client.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Unsealed {
    #[error("not a token of this cluster")]
    Malformed,
    #[error("signed with a key that is no longer in the ring")]
    UnknownKey,
    #[error("its signature does not match")]
    Forged,
}

struct Key {
    id: [u8; KEY_ID],
    hmac: hmac::Key,
}

pub struct KeyRing {
    /// The first seals; all are accepted.
    keys: Vec<Key>,
}

impl KeyRing {
    /// `secrets`: the current one first. Empty rings seal nothing: config
    /// validation requires a secret.
    pub fn new(secrets: &[String]) -> KeyRing {
        let keys = secrets
            .iter()
            .map(|secret| {
                let digest = Sha256::new()
                    .chain_update(b"plexus cluster key id\0")
                    .chain_update(secret.as_bytes())
                    .finalize();
                let mut id = [0u8; KEY_ID];
                id.copy_from_slice(&digest[..KEY_ID]);
                Key {
                    id,
                    hmac: hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes()),
                }
            })
            .collect();
        KeyRing { keys }
    }

    /// A fresh token naming `node`, bound to `bound` (a principal, a request line):
    /// base64url of version, key id, 128 random bits, the node, the tag.
    pub fn seal(&self, purpose: Purpose, node: &str, bound: &str) -> String {
        self.seal_with(rand::random(), purpose, node, bound)
    }

    /// The same token each time for the same node and `bound` (under the same
    /// key): a name the client compares with one it saw before (a task id in
    /// `tasks/get`'s answer) stays equal.
    pub fn seal_stable(&self, purpose: Purpose, node: &str, bound: &str) -> String {
        let digest = Sha256::new()
            .chain_update(purpose.label())
            .chain_update([0])
            .chain_update(node.as_bytes())
            .chain_update([0])
            .chain_update(bound.as_bytes())
            .finalize();
        let mut nonce = [0u8; NONCE];
        nonce.copy_from_slice(&digest[..NONCE]);
        self.seal_with(nonce, purpose, node, bound)
    }

    /// A name an upstream gave (its `requestState`, a task id) sealed for `node` and
    /// `principal`: `<token>.<carried, base64url>`, the carried text and the
    /// principal bound into the token, so neither an edit nor another principal
    /// holding it opens it. Stable, as a task id must be.
    pub fn seal_carried(
        &self,
        purpose: Purpose,
        node: &str,
        principal: &str,
        carried: &str,
    ) -> String {
        let token = self.seal_stable(purpose, node, &carried_bound(principal, carried));
        format!("{token}.{}", URL_SAFE_NO_PAD.encode(carried.as_bytes()))
    }

    /// The node and the carried text of `<token>` or `<token>.<carried>` sealed for
    /// `principal` (a bare token: one bound to nothing, plexus's own round).
    pub fn open_carried(
        &self,
        purpose: Purpose,
        sealed: &str,
        principal: &str,
    ) -> Result<(String, Option<String>), Unsealed> {
        let Some((token, carried)) = sealed.split_once('.') else {
            return self.open(purpose, sealed, "").map(|node| (node, None));
        };
        let carried = URL_SAFE_NO_PAD
            .decode(carried)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or(Unsealed::Malformed)?;
        let node = self.open(purpose, token, &carried_bound(principal, &carried))?;
        Ok((node, Some(carried)))
    }

    fn seal_with(&self, nonce: [u8; NONCE], purpose: Purpose, node: &str, bound: &str) -> String {
        let Some(key) = self.keys.first() else {
            // Unreachable with a validated config; an unsigned token opens nowhere.
            return URL_SAFE_NO_PAD.encode(nonce);
        };
        let mut token = Vec::with_capacity(1 + KEY_ID + NONCE + node.len() + TAG);
        token.push(VERSION);
        token.extend_from_slice(&key.id);
        token.extend_from_slice(&nonce);
        token.extend_from_slice(node.as_bytes());
        let tag = tag(key, purpose, &token, bound);
        token.extend_from_slice(&tag.as_ref()[..TAG]);
        URL_SAFE_NO_PAD.encode(token)
    }

    /// The node a token names, if it was sealed by this cluster for `purpose` and `bound`.
    pub fn open(&self, purpose: Purpose, token: &str, bound: &str) -> Result<String, Unsealed> {
        let bytes = URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| Unsealed::Malformed)?;
        if bytes.len() <= 1 + KEY_ID + NONCE + TAG || bytes[0] != VERSION {
            return Err(Unsealed::Malformed);
        }
        let (signed, presented) = bytes.split_at(bytes.len() - TAG);
        let key = self
            .keys
            .iter()
            .find(|key| key.id[..] == signed[1..1 + KEY_ID])
            .ok_or(Unsealed::UnknownKey)?;
        let expected = tag(key, purpose, signed, bound);
        if !bool::from(expected.as_ref()[..TAG].ct_eq(presented)) {
            return Err(Unsealed::Forged);
        }
        String::from_utf8(signed[1 + KEY_ID + NONCE..].to_vec()).map_err(|_| Unsealed::Malformed)
    }
}

/// What a carried name is bound to: who was given it, and the name itself.
fn carried_bound(principal: &str, carried: &str) -> String {
    format!("{principal}\0{carried}")
}

fn tag(key: &Key, purpose: Purpose, signed: &[u8], bound: &str) -> hmac::Tag {
    let mut context = hmac::Context::with_key(&key.hmac);
    context.update(purpose.label());
    context.update(&[0]);
    context.update(signed);
    context.update(&[0]);
    context.update(bound.as_bytes());
    context.sign()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ring(secrets: &[&str]) -> KeyRing {
        KeyRing::new(&secrets.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn tokens_open_only_for_their_node_purpose_principal_and_ring() {
        let old = ring(&["old secret, thirty-two characters"]);
        let rotated = ring(&[
            "new secret, thirty-two characters",
            "old secret, thirty-two characters",
        ]);
        let id = old.seal(Purpose::Session, "n2", "alice");
        assert_eq!(
            rotated.open(Purpose::Session, &id, "alice"),
            Ok("n2".into())
        );
        assert_eq!(
            rotated.open(Purpose::Session, &id, "bob"),
            Err(Unsealed::Forged)
        );
        assert_eq!(
            rotated.open(Purpose::State, &id, "alice"),
            Err(Unsealed::Forged)
        );
        let retired = ring(&["new secret, thirty-two characters"]);
        assert_eq!(
            retired.open(Purpose::Session, &id, "alice"),
            Err(Unsealed::UnknownKey)
        );
        // A session sealed under the new key, its node edited to another's.
        let fresh = rotated.seal(Purpose::Session, "n1", "alice");
        let mut bytes = URL_SAFE_NO_PAD.decode(&fresh).unwrap();
        bytes[1 + KEY_ID + NONCE + 1] = b'3';
        let moved = URL_SAFE_NO_PAD.encode(bytes);
        assert_eq!(
            rotated.open(Purpose::Session, &moved, "alice"),
            Err(Unsealed::Forged)
        );
        for garbage in ["", "zz", "not base64!", &fresh[..fresh.len() - 4]] {
            assert!(
                rotated.open(Purpose::Session, garbage, "alice").is_err(),
                "{garbage}"
            );
        }
        assert_ne!(fresh, rotated.seal(Purpose::Session, "n1", "alice"));
    }

    #[test]
    fn an_upstreams_names_open_only_for_the_principal_they_were_given_to() {
        let ring = ring(&["a secret, thirty-two characters.."]);
        for purpose in [Purpose::State, Purpose::Task] {
            let sealed = ring.seal_carried(purpose, "n1", "alice", "fx:7");
            assert_eq!(
                ring.open_carried(purpose, &sealed, "alice"),
                Ok(("n1".into(), Some("fx:7".into())))
            );
            // Another principal holding it, or it moved to another purpose.
            assert_eq!(
                ring.open_carried(purpose, &sealed, "bob"),
                Err(Unsealed::Forged)
            );
            let other = if purpose == Purpose::State {
                Purpose::Task
            } else {
                Purpose::State
            };
            assert_eq!(
                ring.open_carried(other, &sealed, "alice"),
                Err(Unsealed::Forged)
            );
            // A task id stays the same name for its principal, and is another's for bob.
            assert_eq!(sealed, ring.seal_carried(purpose, "n1", "alice", "fx:7"));
            assert_ne!(sealed, ring.seal_carried(purpose, "n1", "bob", "fx:7"));
            // Alice's token carrying another name.
            let (token, _) = sealed.split_once('.').unwrap();
            let edited = format!("{token}.{}", URL_SAFE_NO_PAD.encode("fx:8"));
            assert_eq!(
                ring.open_carried(purpose, &edited, "alice"),
                Err(Unsealed::Forged)
            );
            assert_eq!(
                ring.open_carried(purpose, &format!("{token}.!!"), "alice"),
                Err(Unsealed::Malformed)
            );
        }
        // plexus's own round: a bare token, bound to nothing carried.
        let own = ring.seal(Purpose::State, "n2", "");
        assert_eq!(
            ring.open_carried(Purpose::State, &own, "anyone"),
            Ok(("n2".into(), None))
        );
    }

    #[test]
    fn hostile_tokens_never_open_and_never_panic() {
        let ring = ring(&["old secret, thirty-two characters"]);
        let session = ring.seal(Purpose::Session, "n2", "alice");
        let carried = ring.seal_carried(Purpose::State, "n2", "alice", "upstream's state");
        let seeds: [&[u8]; 2] = [session.as_bytes(), carried.as_bytes()];
        let cases = mutations::cases(&seeds, 4_000, 0x5EA1);
        mutations::check("KeyRing::open", &cases, 16, |token| {
            let token = String::from_utf8_lossy(token);
            // Only the very tokens sealed open: an edit is a forgery.
            if let Ok(node) = ring.open(Purpose::Session, &token, "alice") {
                assert_eq!((node.as_str(), &*token), ("n2", session.as_str()));
            }
            if let Ok((node, state)) = ring.open_carried(Purpose::State, &token, "alice") {
                assert_eq!(node, "n2");
                assert_eq!(state.as_deref(), Some("upstream's state"));
            }
        });
    }
}
