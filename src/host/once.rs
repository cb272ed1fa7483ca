//! A future computed once and awaited by many DataFusion partitions (the
//! build side of a `CollectLeft` join).

use std::future::Future;
use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use futures::future::{BoxFuture, FutureExt, Shared};

type SharedResult<T> = std::result::Result<Arc<T>, Arc<DataFusionError>>;

/// The shared, lazily driven result of one future.
pub(crate) struct OnceFut<T> {
    future: Shared<BoxFuture<'static, SharedResult<T>>>,
}

impl<T> Clone for OnceFut<T> {
    fn clone(&self) -> Self {
        Self {
            future: self.future.clone(),
        }
    }
}

impl<T: Send + Sync + 'static> OnceFut<T> {
    /// Wraps `future`; it runs when first awaited.
    pub(crate) fn new(future: impl Future<Output = Result<T>> + Send + 'static) -> Self {
        Self {
            future: future
                .map(|r| r.map(Arc::new).map_err(Arc::new))
                .boxed()
                .shared(),
        }
    }

    /// The result, computing it if no one has yet.
    pub(crate) async fn get(&self) -> Result<Arc<T>> {
        self.future.clone().await.map_err(DataFusionError::Shared)
    }
}
