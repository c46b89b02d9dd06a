//! Protocol tests of the endpoint picker.
