package broker

// Retries sets this subscriber's retry policy, refining the broker's
// (WithRetryPolicy): see RetryPolicy for what its zero fields and its
// ByCode rules mean.
func Retries(p RetryPolicy) SubscribeOption { return WithSubscriberRetryPolicy(p) }

// HandlerMiddleware wraps this subscriber's handler in mw, in the order
// given (the first is outermost), inside the broker's middleware
// (WithMiddleware). nil entries are refused.
func HandlerMiddleware(mw ...Middleware) SubscribeOption { return WithSubscriberMiddleware(mw...) }
