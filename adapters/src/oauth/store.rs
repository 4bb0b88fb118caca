//! What an OAuth client keeps between runs, one file per MCP server under the
//! state directory, mode 0600: its registrations, by authorization server, and
//! its tokens. Encrypted (AES-256-GCM, `ring`) with the key in `key` beside the
//! files, made once (mode 0600); the file's name is the associated data, so a
//! file copied over another's name does not open. A plain JSON file (written
//! before encryption) is read once and rewritten encrypted. Written whole to a
//! temporary file and renamed over, so a reader never sees half of one.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::OAuthError;

/// A client identity at one authorization server. No `Debug`: it holds a secret.
#[derive(Clone, Serialize, Deserialize)]
pub struct Registration {
    pub client_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// `none`, `client_secret_basic`, `client_secret_post` or `private_key_jwt`.
    pub auth_method: String,
    /// Made by RFC 7591 registration (kept and reused; made again only when the
    /// server no longer knows it).
    #[serde(default)]
    pub dynamic: bool,
}

/// Tokens from one authorization server for one resource. No `Debug`.
#[derive(Clone, Serialize, Deserialize)]
pub struct Tokens {
    pub issuer: String,
    pub resource: String,
    pub access_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// Seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// The scopes asked for (what a step-up adds to).
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Seconds since the epoch when the token was issued: with `expires_at`, its
    /// lifetime, which bounds how early it is refreshed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_at: Option<u64>,
}

#[derive(Clone, Default, Serialize, Deserialize)]
pub struct Stored {
    #[serde(default)]
    pub registrations: BTreeMap<String, Registration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Tokens>,
}

/// Where one server's file is; None keeps everything in memory.
#[derive(Clone, Debug)]
pub struct TokenStore {
    path: Option<PathBuf>,
}

impl TokenStore {
    /// The file for the MCP server at `server_url` under `directory`
    /// (`<state_dir>/oauth`): named by a digest of the URL.
    pub fn for_server(directory: &Path, server_url: &str) -> TokenStore {
        let digest = Sha256::digest(server_url.as_bytes());
        let name: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        TokenStore {
            path: Some(directory.join(format!("{name}.json"))),
        }
    }

    pub fn in_memory() -> TokenStore {
        TokenStore { path: None }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// What the file holds; nothing when it is missing or unreadable (a login
    /// then starts afresh). A plain file is rewritten encrypted.
    pub fn load(&self) -> Stored {
        let Some(path) = &self.path else {
            return Stored::default();
        };
        let Ok(bytes) = std::fs::read(path) else {
            return Stored::default();
        };
        if let Some(sealed) = bytes.strip_prefix(MAGIC) {
            return match self.open_sealed(path, sealed) {
                Ok(stored) => stored,
                Err(reason) => {
                    tracing::warn!(path = %path.display(), reason, "the OAuth token file does not open; starting afresh");
                    Stored::default()
                }
            };
        }
        match serde_json::from_slice::<Stored>(&bytes) {
            Ok(stored) => {
                match self.save(&stored) {
                    Ok(()) => {
                        tracing::info!(path = %path.display(), "the OAuth token file was plain; rewritten encrypted")
                    }
                    Err(error) => {
                        tracing::warn!(path = %path.display(), error = %crate::error_chain(&error), "could not rewrite the plain OAuth token file encrypted")
                    }
                }
                stored
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), line = error.line(), "the OAuth token file is not readable; starting afresh");
                Stored::default()
            }
        }
    }

    fn open_sealed(&self, path: &Path, sealed: &[u8]) -> Result<Stored, &'static str> {
        let key = read_key(&key_path(path)).map_err(|_| "its key file is unreadable")?;
        if sealed.len() < NONCE_LEN {
            return Err("it is truncated");
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| "it is truncated")?;
        let mut buffer = ciphertext.to_vec();
        let plain = key
            .open_in_place(nonce, Aad::from(aad(path)), &mut buffer)
            .map_err(|_| "it does not decrypt with the key file")?;
        serde_json::from_slice(plain).map_err(|_| "its contents are not a token record")
    }

    pub fn save(&self, stored: &Stored) -> Result<(), OAuthError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let failed = |error: std::io::Error| OAuthError::Store {
            path: path.clone(),
            source: error,
        };
        let directory = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(directory).map_err(failed)?;
        let key = key_for(&key_path(path)).map_err(failed)?;
        let mut buffer = serde_json::to_vec(stored).map_err(|error| failed(error.into()))?;
        let mut nonce = [0u8; NONCE_LEN];
        rand::fill(&mut nonce[..]);
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(path)),
            &mut buffer,
        )
        .map_err(|_| failed(std::io::Error::other("sealing failed")))?;
        let mut bytes = Vec::with_capacity(MAGIC.len() + NONCE_LEN + buffer.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&nonce);
        bytes.extend_from_slice(&buffer);
        let temporary = path.with_extension("json.tmp");
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&temporary)
                .map_err(failed)?;
            file.write_all(&bytes).map_err(failed)?;
            file.sync_all().map_err(failed)?;
        }
        std::fs::rename(&temporary, path).map_err(failed)
    }

    /// Forgets everything (`plexus logout`).
    pub fn clear(&self) -> Result<(), OAuthError> {
        match &self.path {
            Some(path) => match std::fs::remove_file(path) {
                Ok(()) => Ok(()),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(error) => Err(OAuthError::Store {
                    path: path.clone(),
                    source: error,
                }),
            },
            None => Ok(()),
        }
    }
}

/// What an encrypted file starts with (then the nonce, then the ciphertext and tag).
const MAGIC: &[u8] = b"plexus-oauth-v1\n";
const KEY_FILE: &str = "key";

fn key_path(file: &Path) -> PathBuf {
    file.parent().unwrap_or(Path::new(".")).join(KEY_FILE)
}

fn aad(file: &Path) -> &[u8] {
    file.file_name()
        .map(|name| name.as_encoded_bytes())
        .unwrap_or_default()
}

fn read_key(path: &Path) -> std::io::Result<LessSafeKey> {
    let bytes = std::fs::read(path)?;
    let key = UnboundKey::new(&AES_256_GCM, &bytes)
        .map_err(|_| std::io::Error::other("the key file is not a 256-bit key"))?;
    Ok(LessSafeKey::new(key))
}

/// The key, made (32 random bytes, mode 0600) when there is none yet; two
/// processes making it at once agree on the first one written.
fn key_for(path: &Path) -> std::io::Result<LessSafeKey> {
    use std::os::unix::fs::OpenOptionsExt as _;
    match read_key(path) {
        Ok(key) => return Ok(key),
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        Err(_) => {}
    }
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes[..]);
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
    }
    // A hard link fails when the key exists: the one already there wins.
    let linked = std::fs::hard_link(&temporary, path);
    let _ = std::fs::remove_file(&temporary);
    match linked {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(error),
    }
    read_key(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn the_file_is_private_and_read_back() {
        let directory = tempfile::tempdir().unwrap();
        let store = TokenStore::for_server(&directory.path().join("oauth"), "http://h/mcp");
        let stored = Stored {
            registrations: BTreeMap::new(),
            tokens: Some(Tokens {
                issuer: "http://as".into(),
                resource: "http://h/mcp".into(),
                access_token: "secret-access".into(),
                refresh_token: None,
                expires_at: Some(5),
                scopes: vec!["a".into()],
                issued_at: None,
            }),
        };
        store.save(&stored).unwrap();
        for path in [
            store.path().unwrap().to_path_buf(),
            directory.path().join("oauth/key"),
        ] {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        }
        let bytes = std::fs::read(store.path().unwrap()).unwrap();
        assert!(bytes.starts_with(MAGIC));
        assert!(!bytes.windows(13).any(|w| w == b"secret-access"));
        let back = store.load();
        assert_eq!(back.tokens.unwrap().access_token, "secret-access");
        store.clear().unwrap();
        assert!(store.load().tokens.is_none());
    }

    #[test]
    fn a_plain_file_is_read_once_and_rewritten_encrypted() {
        let directory = tempfile::tempdir().unwrap();
        let store = TokenStore::for_server(&directory.path().join("oauth"), "http://h/mcp");
        let path = store.path().unwrap().to_path_buf();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let plain = r#"{"registrations":{},"tokens":{"issuer":"http://as","resource":"http://h/mcp","access_token":"plain-access","scopes":[]}}"#;
        std::fs::write(&path, plain).unwrap();
        assert_eq!(store.load().tokens.unwrap().access_token, "plain-access");
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(MAGIC), "not rewritten encrypted");
        assert!(!bytes.windows(12).any(|w| w == b"plain-access"));
        assert_eq!(store.load().tokens.unwrap().access_token, "plain-access");
        // Another key does not open it.
        std::fs::write(directory.path().join("oauth/key"), [7u8; 32]).unwrap();
        assert!(store.load().tokens.is_none());
    }

    #[test]
    fn a_hostile_token_file_starts_afresh_and_never_panics() {
        let directory = tempfile::tempdir().unwrap();
        let store = TokenStore::for_server(&directory.path().join("oauth"), "http://h/mcp");
        let plain = br#"{"registrations":{"http://as":{"client_id":"c","client_secret":"s","auth_method":"client_secret_basic","dynamic":true}},"tokens":{"issuer":"http://as","resource":"http://h/mcp","access_token":"a","refresh_token":"r","expires_at":5,"scopes":["x"],"issued_at":1}}"#;
        store
            .save(&serde_json::from_slice::<Stored>(plain).unwrap())
            .unwrap();
        let sealed = std::fs::read(store.path().unwrap()).unwrap();
        let path = store.path().unwrap().to_path_buf();
        let cases = mutations::cases(&[plain, &sealed], 600, 0x70C);
        mutations::check("TokenStore::load", &cases, 16, |file| {
            std::fs::write(&path, file).unwrap();
            let stored = store.load();
            if let Some(tokens) = stored.tokens {
                assert!(tokens.access_token.len() <= file.len());
            }
        });
    }
}
