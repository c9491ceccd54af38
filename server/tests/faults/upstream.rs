//! (Scaffold: fault tests of issue 10.)

#[allow(unused_imports)]
use crate::common;
