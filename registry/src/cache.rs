//! 2026-07-28 cache hints (`ttlMs`, `cacheScope`) of lists, merged the way an
//! intermediary must: a merged list is fresh only as long as its shortest-lived
//! part, and shareable across callers only if every part is.

/// How long a list may be cached and by whom.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheHint {
    pub ttl_ms: u64,
    /// `cacheScope: "public"`: the same for every caller; else `"private"`.
    pub public: bool,
}

impl CacheHint {
    /// What a list without hints (every handshake-era upstream's) allows: nothing.
    pub const NONE: CacheHint = CacheHint {
        ttl_ms: 0,
        public: false,
    };

    /// The hints of one list result: a missing or malformed `ttlMs` is 0 (the
    /// revision's rule for clients), anything but `"public"` is private.
    pub fn of_result(result: &serde_json::Map<String, serde_json::Value>) -> CacheHint {
        CacheHint {
            ttl_ms: result
                .get("ttlMs")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0),
            public: result.get("cacheScope").and_then(serde_json::Value::as_str) == Some("public"),
        }
    }

    /// Both parts at once: the shorter lifetime, public only if both are.
    pub fn and(self, other: CacheHint) -> CacheHint {
        CacheHint {
            ttl_ms: self.ttl_ms.min(other.ttl_ms),
            public: self.public && other.public,
        }
    }

    /// The hint of a list merged from these parts; no part at all is [`CacheHint::NONE`].
    pub fn merged(parts: impl IntoIterator<Item = CacheHint>) -> CacheHint {
        parts
            .into_iter()
            .reduce(CacheHint::and)
            .unwrap_or(CacheHint::NONE)
    }

    pub fn scope(self) -> &'static str {
        if self.public {
            "public"
        } else {
            "private"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Map, Value};

    fn of(value: Value) -> CacheHint {
        let Value::Object(result) = value else {
            return CacheHint::of_result(&Map::new());
        };
        CacheHint::of_result(&result)
    }

    #[test]
    fn hints_are_read_leniently_and_merge_to_the_shortest_and_narrowest() {
        let public = of(json!({"ttlMs": 60000, "cacheScope": "public"}));
        assert_eq!(
            public,
            CacheHint {
                ttl_ms: 60000,
                public: true
            }
        );
        assert_eq!(of(json!({"tools": []})), CacheHint::NONE);
        assert_eq!(
            of(json!({"ttlMs": -5, "cacheScope": "shared"})),
            CacheHint::NONE
        );
        let short_private = CacheHint {
            ttl_ms: 1000,
            public: false,
        };
        assert_eq!(
            CacheHint::merged([public, short_private]),
            CacheHint {
                ttl_ms: 1000,
                public: false
            }
        );
        assert_eq!(
            CacheHint::merged([public, public]),
            public,
            "public parts stay public"
        );
        assert_eq!(CacheHint::merged([]), CacheHint::NONE);
    }
}
