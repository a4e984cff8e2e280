%% Exchange type `x-delayed-message` for redeliver's development and CI broker.
%%
%% It implements the contract of the community plugin
%% `rabbitmq_delayed_message_exchange` (3.10.x and 4.x series) as documented
%% in tests/broker/README.md, with two deliberate differences:
%%   * a publisher confirm for a held message is sent only after the message is
%%     on disk (route/2 blocks on an fsync'd group commit), and
%%   * a malformed `x-delay` string routes immediately instead of crashing.
%%
%% Routing is delegated to the exchange type named by `x-delayed-type`; this
%% module only decides *when* a message is routed.
%%
%% One source for RabbitMQ 3.10 and 4.x. The broker calls the callbacks of
%% its own version: 3.10 route/2 with a #delivery{} and delete/3; 4.x (3.13
%% on) route/3 with an `mc` container and delete/2. Each is exported; the
%% others are never called. Nothing here calls a 3.10-only internal from a
%% 4.x path (rabbit_amqqueue:deliver/2 and lookup_many/1 are gone there).
-module(redeliver_delayed_exchange).
-behaviour(rabbit_exchange_type).

-include_lib("rabbit_common/include/rabbit.hrl").

-export([description/0, serialise_events/0, route/2, route/3, validate/1,
         validate_binding/2, create/2, delete/2, delete/3, policy_changed/2,
         add_binding/3, remove_bindings/3, assert_args_equivalence/2,
         info/1, info/2]).
-export([delay_ms/1, parse_delay/2]).

-define(TYPE, <<"x-delayed-message">>).
-define(ARG, <<"x-delayed-type">>).
-define(MAX_DELAY, 4294967295).

-rabbit_boot_step({?MODULE,
                   [{description, "exchange type x-delayed-message (redeliver test stand-in)"},
                    {mfa, {rabbit_registry, register, [exchange, ?TYPE, ?MODULE]}},
                    {cleanup, {rabbit_registry, unregister, [exchange, ?TYPE]}},
                    {requires, rabbit_registry},
                    {enables, kernel_ready}]}).

%% The store must exist before the first publish (networking starts after
%% routing_ready) and it routes into queues, so it needs them recovered.
-rabbit_boot_step({redeliver_delayed_store,
                   [{description, "x-delayed-message durable store and scheduler"},
                    {mfa, {rabbit_sup, start_child, [redeliver_delayed_store]}},
                    {cleanup, {rabbit_sup, stop_child, [redeliver_delayed_store]}},
                    {requires, recovery},
                    {enables, routing_ready}]}).

description() ->
    [{description, <<"Delayed message exchange (redeliver test stand-in)">>}].

serialise_events() -> false.

%% The store routes due messages from its own process with the
%% `routing_now` flag set, so they pass straight to the underlying type
%% with their original headers (upstream rewrites `x-delay` instead).
%% RabbitMQ 3.10: a #delivery{} carrying a #basic_message{}.
route(X, #delivery{message = Msg} = Delivery) ->
    route_or_hold(X, Msg, fun() -> (type_module(X)):route(X, Delivery) end).

%% RabbitMQ 4.x: an `mc` message container. 4.x keeps its direct-routing
%% index and its topic trie only for exchanges of those types, so neither
%% has this exchange's bindings: direct routing matches the binding table
%% (as the upstream 4.x series does) and topic patterns are matched here.
route(X, Mc, Opts) ->
    route_or_hold(X, Mc, fun() -> route_now(X, Mc, Opts) end).

%% Both versions: a due message (routing_now) or one without a valid delay
%% is routed by RouteNow; any other is held.
route_or_hold(X, Msg, RouteNow) ->
    case redeliver_delayed_store:routing_now() orelse delay_ms(Msg) of
        {ok, Ms} -> hold(X, Ms, Msg);
        _RoutingNowOrNone -> RouteNow()
    end.

route_now(#exchange{name = XName} = X, Mc, Opts) ->
    case type_module(X) of
        rabbit_exchange_type_direct ->
            rabbit_router:match_routing_key(XName, mc:routing_keys(Mc));
        rabbit_exchange_type_topic ->
            match_topic(XName, mc:routing_keys(Mc));
        Mod -> Mod:route(X, Mc, Opts)
    end.

match_topic(XName, RKs) ->
    Words = [words(RK) || RK <- RKs],
    lists:usort([D || #binding{key = K, destination = D}
                          <- rabbit_binding:list_for_source(XName),
                      W <- Words, topic_match(words(K), W)]).

words(Key) -> binary:split(Key, <<".">>, [global]).

%% AMQP topic matching: `*` is one word, `#` zero or more.
topic_match([], []) -> true;
topic_match([<<"#">> | Ps], Ws) ->
    topic_match(Ps, Ws) orelse (Ws =/= [] andalso topic_match([<<"#">> | Ps], tl(Ws)));
topic_match([<<"*">> | Ps], [_ | Ws]) -> topic_match(Ps, Ws);
topic_match([W | Ps], [W | Ws]) -> topic_match(Ps, Ws);
topic_match(_, _) -> false.

hold(#exchange{name = XName}, Ms, Msg) ->
    case redeliver_delayed_store:hold(XName, Ms, Msg) of
        ok -> [];
        {error, Reason} ->
            rabbit_misc:protocol_error(internal_error,
                                       "delayed message could not be stored: ~p",
                                       [Reason])
    end.

validate(#exchange{arguments = Args} = X) ->
    case rabbit_misc:table_lookup(Args, ?ARG) of
        undefined ->
            precondition_failed("Invalid argument, 'x-delayed-type' must be "
                                "an existing exchange type", []);
        {longstr, <<>>} ->
            precondition_failed("Invalid argument, 'x-delayed-type' must not "
                                "be empty", []);
        {longstr, ?TYPE} ->
            precondition_failed("Invalid argument, 'x-delayed-type' cannot "
                                "be 'x-delayed-message'", []);
        {longstr, Type} ->
            case lookup_type(Type) of
                {ok, Mod} -> Mod:validate(X);
                error ->
                    precondition_failed("Invalid argument, 'x-delayed-type' "
                                        "names unknown exchange type '~ts'",
                                        [Type])
            end;
        {_, _} ->
            precondition_failed("Invalid argument, 'x-delayed-type' must be "
                                "a string", [])
    end.

validate_binding(X, B) -> (type_module(X)):validate_binding(X, B).

create(Tx, X) -> (type_module(X)):create(Tx, X).

%% RabbitMQ 3.10 calls this once inside the Mnesia transaction and once
%% after it; held messages are dropped only after the deletion committed.
delete(Tx, #exchange{name = XName} = X, Bs) ->
    case Tx of
        transaction -> ok;
        _ -> ok = redeliver_delayed_store:drop_exchange(XName)
    end,
    (type_module(X)):delete(Tx, X, Bs).

%% RabbitMQ 4.x calls this once, after the deletion.
delete(Serial, #exchange{name = XName} = X) ->
    ok = redeliver_delayed_store:drop_exchange(XName),
    (type_module(X)):delete(Serial, X).

policy_changed(_X1, _X2) -> ok.

add_binding(Tx, X, B) -> (type_module(X)):add_binding(Tx, X, B).

remove_bindings(Tx, X, Bs) -> (type_module(X)):remove_bindings(Tx, X, Bs).

assert_args_equivalence(#exchange{name = Name, arguments = Args}, Required) ->
    rabbit_misc:assert_args_equivalence(Args, Required, Name,
                                        [?ARG, <<"alternate-exchange">>]).

%% `messages_delayed`, which the management API shows for the exchange, as
%% upstream reports it.
info(X) -> info(X, [messages_delayed]).
info(#exchange{name = XName}, Items) ->
    [{messages_delayed, redeliver_delayed_store:held_for(XName)}
     || lists:member(messages_delayed, Items)].

%% ---------------------------------------------------------------------------

precondition_failed(Fmt, Args) ->
    rabbit_misc:protocol_error(precondition_failed, Fmt, Args).

lookup_type(Bin) ->
    case rabbit_registry:binary_to_type(Bin) of
        {error, not_found} -> error;
        Atom ->
            case rabbit_registry:lookup_module(exchange, Atom) of
                {ok, Mod} -> {ok, Mod};
                {error, not_found} -> error
            end
    end.

type_module(#exchange{arguments = Args}) ->
    {longstr, Type} = rabbit_misc:table_lookup(Args, ?ARG),
    {ok, Mod} = lookup_type(Type),
    Mod.

%% `{ok, Ms}` when the message must be held, `none` when it routes now.
delay_ms(#basic_message{content = Content}) ->
    case rabbit_basic:extract_headers(Content) of
        undefined -> none;
        Headers ->
            case rabbit_misc:table_lookup(Headers, <<"x-delay">>) of
                undefined -> none;
                {Type, Value} -> parse_delay(Type, Value)
            end
    end;
delay_ms(Mc) ->
    case mc:x_header(<<"x-delay">>, Mc) of
        {Type, Value} -> parse_delay(Type, Value);
        %% undefined, or `null` for a void header
        _ -> none
    end.

%% Any AMQP integer type, a float (truncated) or a numeric string counts;
%% everything else, and anything outside 1..4294967295, routes at once.
%% 3.10 gives AMQP 0-9-1 field types (`longstr`, `bool`); 4.x's `mc` gives
%% AMQP 1.0 ones (`utf8`, `boolean`).
parse_delay(Type, V) when is_integer(V), Type =/= timestamp, Type =/= bool ->
    in_range(V);
parse_delay(Type, V) when is_float(V), (Type =:= float orelse Type =:= double) ->
    in_range(trunc(V));
parse_delay(Type, Bin) when is_binary(Bin), (Type =:= longstr orelse Type =:= utf8) ->
    %% string:trim/1 raises on invalid UTF-8; any odd string routes at once.
    try string_number(string:trim(Bin)) of
        {ok, N} -> in_range(N);
        error -> none
    catch _:_ -> none
    end;
parse_delay(_Type, _V) -> none.

string_number(Bin) ->
    try {ok, binary_to_integer(Bin)}
    catch error:badarg ->
            try {ok, trunc(binary_to_float(Bin))}
            catch error:badarg -> error
            end
    end.

in_range(N) when N >= 1, N =< ?MAX_DELAY -> {ok, N};
in_range(_) -> none.
