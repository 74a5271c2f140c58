//! The old paths of items that moved (CHANGELOG.md) still name the same items.
#![allow(deprecated)]

use std::any::TypeId;

#[test]
fn old_paths_name_the_moved_items() {
    assert_eq!(
        TypeId::of::<durable::Outcome>(),
        TypeId::of::<durable::runtime::Outcome>()
    );
    assert_eq!(
        TypeId::of::<durable::ArgumentErrorKind>(),
        TypeId::of::<durable::error::ArgumentErrorKind>()
    );
    assert_eq!(
        TypeId::of::<durable::toolbox::Toolbox>(),
        TypeId::of::<durable::Toolbox>()
    );
    assert_eq!(
        TypeId::of::<durable::toolbox::ToolResult>(),
        TypeId::of::<durable::ToolResult>()
    );
    // Variants through the old path, in a pattern.
    assert!(matches!(
        durable::runtime::Outcome::CacheHit,
        durable::Outcome::CacheHit
    ));
    // A trait cannot be aliased: the old path is the trait itself.
    assert_eq!(
        TypeId::of::<Box<dyn durable::toolbox::Tool>>(),
        TypeId::of::<Box<dyn durable::Tool>>()
    );
}
