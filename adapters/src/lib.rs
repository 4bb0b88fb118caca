//! plexus upstream connections.
