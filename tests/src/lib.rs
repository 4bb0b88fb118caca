//! plexus integration harness.
