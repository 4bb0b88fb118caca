//! The plexus catalog.
