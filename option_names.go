package broker

// Retries sets this subscriber's retry policy, refining the broker's
// (WithRetryPolicy): p's zero fields take the broker's policy's values,
// and its ByCode rules are laid over the broker's, code by code.
func Retries(p RetryPolicy) SubscribeOption { return WithSubscriberRetryPolicy(p) }

// HandlerMiddleware wraps this subscriber's handler in mw, in the order
// given (the first is outermost), inside the broker's middleware
// (WithMiddleware). nil entries are refused.
func HandlerMiddleware(mw ...Middleware) SubscribeOption { return WithSubscriberMiddleware(mw...) }
