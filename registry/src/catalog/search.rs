//! A snapshot's tool search: its index built at the first search from the parts'
//! own indexes (cached with the snapshot, so never stale: a new listing, reload or
//! approval makes a new snapshot), holding only the tools this snapshot shows.

use std::sync::Arc;

use serde_json::Value;

use super::{Catalog, Kind};
use crate::search::{self, Expose, PartInput, SearchError, SearchIndex, NOT_SHOWN};

/// A tool a search found.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    /// The exposed name.
    pub name: String,
    pub upstream: Arc<str>,
    /// The upstream's own name.
    pub tool: String,
    pub score: f32,
    /// The tool as `tools/list` would show it.
    pub entry: Value,
}

impl Catalog {
    /// How this catalog offers its tools.
    pub fn expose(&self) -> Expose {
        self.expose
    }

    /// The search index of this snapshot, built at the first call.
    pub fn search_index(&self) -> &SearchIndex {
        self.search
            .get_or_init(|| Arc::new(self.build_search_index()))
    }

    fn build_search_index(&self) -> SearchIndex {
        let mut positions: Vec<Vec<u32>> = self
            .parts
            .iter()
            .map(|part| vec![NOT_SHOWN; part.tables.exposed[Kind::Tools.index()].len()])
            .collect();
        for (position, entry) in self.entries[Kind::Tools.index()].iter().enumerate() {
            if let Some(slot) = positions
                .get_mut(entry.part as usize)
                .and_then(|places| places.get_mut(entry.index as usize))
            {
                *slot = u32::try_from(position).unwrap_or(NOT_SHOWN);
            }
        }
        SearchIndex::build(self.parts.iter().zip(positions).map(|(part, positions)| {
            // A part with nothing shown is not analysed at all.
            let index = if positions.iter().all(|p| *p == NOT_SHOWN) {
                Arc::default()
            } else {
                part.search_index().clone()
            };
            let mut upstream_texts = vec![part.upstream.as_ref()];
            upstream_texts.extend(self.instructions(&part.upstream));
            PartInput {
                index,
                positions,
                upstream_texts,
            }
        }))
    }

    /// The best `limit` tools for `query`, of `upstream` only when given; see
    /// [`search::check`] for what a caller must check first.
    pub fn search_tools(
        &self,
        query: &str,
        limit: usize,
        upstream: Option<&str>,
    ) -> Result<Vec<Found>, SearchError> {
        let only = match upstream {
            None => None,
            Some(name) => {
                let number = self
                    .parts
                    .iter()
                    .position(|part| &*part.upstream == name)
                    .filter(|_| self.shows_upstream(name))
                    .ok_or_else(|| SearchError::UnknownUpstream(name.to_string()))?;
                Some(u32::try_from(number).unwrap_or(u32::MAX))
            }
        };
        let hits = self
            .search_index()
            .search(query, limit.min(search::MAX_LIMIT), only);
        let tools = self.entries(Kind::Tools);
        Ok(hits
            .into_iter()
            .filter_map(|hit| {
                let entry = self.entries[Kind::Tools.index()].get(hit.position as usize)?;
                let part = self.part(entry);
                Some(Found {
                    name: part
                        .exposed_key(Kind::Tools, entry.index as usize)
                        .to_string(),
                    upstream: part.upstream.clone(),
                    tool: part.original(Kind::Tools, entry.index as usize).to_string(),
                    score: hit.score,
                    entry: tools.get(hit.position as usize)?,
                })
            })
            .collect())
    }

    /// The exposed tool named `exposed`, as `tools/list` shows it.
    pub fn tool(&self, exposed: &str) -> Option<Value> {
        let entry = self.routed(Kind::Tools, exposed)?;
        Some(
            self.part(entry)
                .exposed_value(Kind::Tools, entry.index as usize),
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{build_default, listing, tool};
    use super::*;
    use crate::{Quarantine, ToolFilter, View};

    fn described(name: &str, description: &str, parameters: &[&str]) -> Value {
        let properties: serde_json::Map<String, Value> = parameters
            .iter()
            .map(|p| (p.to_string(), json!({"type": "string"})))
            .collect();
        json!({"name": name, "description": description,
               "inputSchema": {"type": "object", "properties": properties}})
    }

    fn names(found: &[Found]) -> Vec<&str> {
        found.iter().map(|found| found.name.as_str()).collect()
    }

    fn catalog() -> Catalog {
        let mut files = listing("files", "files");
        files.tools = vec![
            described(
                "readFile",
                "Reads the complete contents of a file.",
                &["path"],
            ),
            described(
                "write_file",
                "Creates or overwrites a file.",
                &["path", "content"],
            ),
            described(
                "list-directory",
                "Lists the entries of a directory.",
                &["path"],
            ),
        ];
        let mut clock = listing("clock", "clock");
        clock.instructions = Some("Answers questions about time zones.".into());
        clock.tools = vec![
            described("get_current_time", "The current time.", &["timezone"]),
            described("convert", "Converts between zones.", &["source", "target"]),
        ];
        let (catalog, warnings) = build_default(&[files, clock]);
        assert!(warnings.is_empty(), "{warnings:?}");
        catalog
    }

    #[test]
    fn names_descriptions_parameters_and_upstream_texts_are_searched() {
        let catalog = catalog();
        let found = catalog.search_tools("read a file", 3, None).unwrap();
        assert_eq!(found[0].name, "files__readFile");
        assert_eq!(found[0].tool, "readFile");
        assert_eq!(&*found[0].upstream, "files");
        assert_eq!(found[0].entry["name"], "files__readFile");
        assert!(found.windows(2).all(|pair| pair[0].score >= pair[1].score));
        // Stemmed and split: "directories" meets "list-directory".
        let found = catalog.search_tools("directories", 3, None).unwrap();
        assert_eq!(names(&found), ["files__list-directory"]);
        // The upstream's instructions lift both of its tools.
        let found = catalog.search_tools("zones", 5, None).unwrap();
        assert_eq!(names(&found), ["clock__convert", "clock__get_current_time"]);
        // Only the named upstream's tools ("time" is in its instructions too).
        let found = catalog.search_tools("file time", 5, Some("clock")).unwrap();
        assert_eq!(names(&found), ["clock__get_current_time", "clock__convert"]);
        assert_eq!(
            catalog.search_tools("x", 5, Some("ghost")),
            Err(SearchError::UnknownUpstream("ghost".into()))
        );
        assert!(catalog.search_tools("the of", 5, None).unwrap().is_empty());
        assert_eq!(catalog.search_tools("file", 1, None).unwrap().len(), 1);
    }

    #[test]
    fn a_query_routes_to_the_server_whose_tools_it_speaks_of() {
        let mut notes = listing("jot", "jot");
        notes.tools = vec![
            described("add_note", "Adds a note.", &["text"]),
            described("delete_note", "Deletes a note.", &["id"]),
            described("list_notes", "Lists the notes.", &[]),
            described("archive", "Moves an item out of sight.", &["id"]),
        ];
        let mut mail = listing("mail", "mail");
        mail.tools = vec![
            described("archive_message", "Archives a message.", &["id"]),
            described("send", "Sends a message.", &["to"]),
        ];
        let (catalog, _) = build_default(&[notes, mail]);
        // Both archive; the query's other word is what the jot server is about
        // (its name does not say so).
        let found = catalog.search_tools("archive my note", 2, None).unwrap();
        assert_eq!(names(&found)[0], "jot__archive", "{found:?}");
        // Words written apart meet a name written as one.
        let mut git = listing("git", "git");
        git.tools = vec![
            described("git_checkout", "Switches branches.", &["branch"]),
            described("git_branch", "Lists branches.", &[]),
        ];
        let (catalog, _) = build_default(&[git]);
        let found = catalog.search_tools("check out a branch", 2, None).unwrap();
        assert_eq!(names(&found)[0], "git__git_checkout", "{found:?}");
    }

    #[test]
    fn held_and_hidden_tools_and_held_instructions_are_never_found() {
        let mut alpha = listing("alpha", "alpha");
        alpha.tools = vec![
            described("kept", "Sends mail.", &[]),
            described("held", "Sends mail, secretly.", &[]),
        ];
        alpha.instructions = Some("zebra".into());
        let mut quarantine = Quarantine::none();
        quarantine
            .entries
            .insert((Kind::Tools, "held".into()), Arc::new(json!({})));
        quarantine.instructions = true;
        alpha.quarantine = quarantine;
        let mut strict = listing("strict", "strict");
        strict.tools = vec![described("mailer", "Sends mail.", &[])];
        strict.quarantine = Quarantine::whole(json!({"class": "unapproved"}));
        let mut open = listing("open", "open");
        open.tools = vec![tool("mail_merge"), tool("mail_hidden")];
        let (catalog, _) = build_default(&[alpha, strict, open]);
        let found = catalog.search_tools("mail secretly", 50, None).unwrap();
        let mut found = names(&found);
        found.sort_unstable();
        assert_eq!(
            found,
            ["alpha__kept", "open__mail_hidden", "open__mail_merge"]
        );
        assert!(catalog.search_tools("zebra", 50, None).unwrap().is_empty());
        let view = catalog.restrict(&View {
            tools: ToolFilter::new(vec![], vec!["*hidden".into()]),
            expose: Expose::Search,
            ..View::default()
        });
        assert_eq!(view.expose(), Expose::Search);
        let found = view.search_tools("mail", 50, None).unwrap();
        let mut found = names(&found);
        found.sort_unstable();
        assert_eq!(found, ["alpha__kept", "open__mail_merge"]);
    }

    #[test]
    fn a_new_snapshot_finds_what_its_listing_says() {
        let before = catalog();
        assert!(before.search_tools("weather", 5, None).unwrap().is_empty());
        let mut clock = listing("clock", "clock");
        clock.tools = vec![described("forecast", "The weather tomorrow.", &[])];
        let (after, _) = build_default(&[clock]);
        assert_eq!(
            names(&after.search_tools("weather", 5, None).unwrap()),
            ["clock__forecast"]
        );
        assert!(after.search_tools("time", 5, None).unwrap().is_empty());
    }

    #[test]
    fn queries_and_limits_are_checked() {
        assert_eq!(search::check(" ", None), Err(SearchError::EmptyQuery));
        let long = "a".repeat(100_000);
        assert_eq!(
            search::check(&long, None),
            Err(SearchError::QueryTooLong { bytes: 100_000 })
        );
        assert_eq!(
            search::check("x", Some(0)),
            Err(SearchError::Limit { limit: 0 })
        );
        assert_eq!(
            search::check("x", Some(10_000)),
            Err(SearchError::Limit { limit: 10_000 })
        );
        assert_eq!(search::check("x", None), Ok(10));
        assert_eq!(search::check("x", Some(50)), Ok(50));
    }
}
