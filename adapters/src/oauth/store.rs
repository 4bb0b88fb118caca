//! What an OAuth client keeps between runs, one file per MCP server under the
//! state directory, mode 0600: its registrations, by authorization server, and
//! its tokens. Written whole to a temporary file and renamed over, so a reader
//! never sees half of one. (Not encrypted yet: the file's mode guards it.)

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

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
    /// then starts afresh).
    pub fn load(&self) -> Stored {
        let Some(path) = &self.path else {
            return Stored::default();
        };
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|error| {
                tracing::warn!(path = %path.display(), %error, "the OAuth token file is not readable; starting afresh");
                Stored::default()
            }),
            Err(_) => Stored::default(),
        }
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
        let bytes = serde_json::to_vec_pretty(stored).map_err(|error| failed(error.into()))?;
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
            }),
        };
        store.save(&stored).unwrap();
        let mode = std::fs::metadata(store.path().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let back = store.load();
        assert_eq!(back.tokens.unwrap().access_token, "secret-access");
        store.clear().unwrap();
        assert!(store.load().tokens.is_none());
    }
}
