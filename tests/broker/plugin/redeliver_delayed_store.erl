%% Durable store and scheduler for held `x-delayed-message` messages.
%%
%% Held messages live in an append-only log under the node's data directory
%% and in an ordered ETS index keyed by {DueMs, Seq}. Writes are group
%% committed: every hold/3 caller waits for the fsync of the batch that
%% carries its message, so the channel confirms only what is on disk.
%%
%% A due message is routed without confirmation (like the upstream plugin),
%% so its tombstone is written only TOMBSTONE_GRACE_MS later: a node crash
%% inside that window re-routes it after restart (a duplicate, never a loss).
%% A clean stop tombstones what was routed STOP_GRACE_MS or more before it:
%% the queues, which stop after this plugin, have taken those by then.
-module(redeliver_delayed_store).
-behaviour(gen_server).

-include_lib("rabbit_common/include/rabbit.hrl").
%% kernel logger, not rabbit_log: the same calls on 3.10 and 4.x.
-include_lib("kernel/include/logger.hrl").

-export([start_link/0, hold/3, drop_exchange/1, held_count/0, held_for/1,
         routing_now/0, is_ready/0, overdue_at_start/0, wedge/1, unwedge/1]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2,
         code_change/3]).

-define(SERVER, ?MODULE).
-define(INDEX, redeliver_delayed_index).
-define(ROUTING_NOW, redeliver_delayed_routing_now).
-define(TOMBSTONE_GRACE_MS, 2000).
-define(STOP_GRACE_MS, 500).
-define(TOMBSTONE_EVERY_MS, 1000).
%% Queues (quorum leaders especially) need a moment after boot before a
%% stateless delivery to them sticks.
-define(BOOT_GRACE_MS, 1500).
-define(MAX_TIMER_MS, 60000).
-define(COMPACT_MIN_DEAD, 20000).

-record(st, {fd, path, seq = 0, timer, ready = false, pending = [],
             flush_queued = false, tombstones = queue:new(), dead = 0,
             waiting_since, overdue_at_start = 0,
             %% The fault switch (wedge/1): `all`, or the exchanges whose
             %% due messages are held rather than routed.
             wedged = []}).

%% A due message whose quorum queue has no leader yet waits (a stateless
%% delivery to it would be dropped), but not forever.
-define(WAIT_FOR_LEADER_MS, 60000).
-define(RETRY_NOT_READY_MS, 250).
-define(READY_CACHE_MS, 1000).

start_link() -> gen_server:start_link({local, ?SERVER}, ?MODULE, [], []).

%% Blocks the calling channel until the message is fsync'd. With the
%% `late_write_ms` setting (tests of redeliver's --retry-settle only) it
%% mimics the upstream plugin instead: the confirm goes out at once and the
%% message reaches the disk that much later, so a kill -9 in between loses it.
hold(XName, DelayMs, Msg) ->
    case application:get_env(redeliver_delayed_exchange, late_write_ms, 0) of
        Late when is_integer(Late), Late > 0 ->
            gen_server:cast(?SERVER, {hold_late, Late, now_ms() + DelayMs, XName, Msg});
        _ ->
            gen_server:call(?SERVER, {hold, XName, DelayMs, Msg}, 60000)
    end.

drop_exchange(XName) -> gen_server:call(?SERVER, {drop_exchange, XName}, 60000).

held_count() -> ets:info(?INDEX, size).

%% Messages held for one exchange: the management API's `messages_delayed`,
%% as upstream reports it.
held_for(XName) -> ets:select_count(?INDEX, [{{'_', XName, '_'}, [], [true]}]).

%% The fault switch, for tests of redeliver's delay-backend probe: from
%% `wedge(all)` on, no due message is routed, as when the upstream plugin's
%% timer loop spins on an orphan index entry; `wedge(<<"name">>)` holds only
%% that exchange's (vhost /), so parallel tests on one node are not
%% disturbed. Holds are still accepted, stored and confirmed, and nothing is
%% dropped: `unwedge(all)` (or the same name) routes what fell due at once.
wedge(all) -> gen_server:call(?SERVER, {wedge, all}, 5000);
wedge(Name) when is_binary(Name) ->
    gen_server:call(?SERVER, {wedge, rabbit_misc:r(<<"/">>, exchange, Name)}, 5000).

unwedge(all) -> gen_server:call(?SERVER, {unwedge, all}, 5000);
unwedge(Name) when is_binary(Name) ->
    gen_server:call(?SERVER, {unwedge, rabbit_misc:r(<<"/">>, exchange, Name)}, 5000).

%% True once due messages are being routed (after the boot grace);
%% `tests/broker/ctl up` waits for it.
is_ready() -> gen_server:call(?SERVER, is_ready, 5000).

%% How many recovered messages were already due when the node started: an
%% upper bound on the duplicates a restart caused (those routed inside the
%% tombstone grace before the stop are among them). Chaos tests read it.
overdue_at_start() -> gen_server:call(?SERVER, overdue_at_start, 5000).

%% True only inside this server while it routes a due message.
routing_now() -> get(?ROUTING_NOW) =:= true.

init([]) ->
    %% So that a clean node stop runs terminate/2.
    process_flag(trap_exit, true),
    ets:new(?INDEX, [ordered_set, named_table, protected]),
    Path = filename:join(rabbit_mnesia:dir(), "redeliver_delayed_messages.log"),
    Seq = recover(Path),
    {ok, Fd} = rewrite(Path, []),
    erlang:send_after(?BOOT_GRACE_MS, self(), ready),
    erlang:send_after(?TOMBSTONE_EVERY_MS, self(), tombstones),
    Now = now_ms(),
    Overdue = length(ets:select(?INDEX, [{{{'$1', '_'}, '_', '_'},
                                          [{'=<', '$1', Now}], [true]}])),
    ?LOG_INFO("x-delayed-message stand-in: ~b held message(s) recovered,"
                    " ~b already due", [ets:info(?INDEX, size), Overdue]),
    {ok, #st{fd = Fd, path = Path, seq = Seq, overdue_at_start = Overdue}}.

handle_call({hold, XName, DelayMs, Msg}, From, St = #st{seq = Seq}) ->
    Key = {now_ms() + DelayMs, Seq + 1},
    St1 = St#st{seq = Seq + 1, pending = [{From, Key, XName, Msg} | St#st.pending]},
    {noreply, queue_flush(St1)};
handle_call({drop_exchange, XName}, _From, St) ->
    Keys = [K || {K, X, _} <- ets:tab2list(?INDEX), X =:= XName],
    [ets:delete(?INDEX, K) || K <- Keys],
    _ = append(St#st.fd, [frame({done, K}) || K <- Keys]),
    {reply, ok, St#st{dead = St#st.dead + length(Keys)}};
handle_call(is_ready, _From, St) ->
    {reply, St#st.ready, St};
handle_call({wedge, all}, _From, St) ->
    ?LOG_WARNING("x-delayed-message stand-in: wedged (no due message is routed)"),
    {reply, ok, arm(St#st{wedged = all})};
handle_call({wedge, _}, _From, St = #st{wedged = all}) ->
    {reply, ok, St};
handle_call({wedge, XName}, _From, St = #st{wedged = Ws}) ->
    ?LOG_WARNING("x-delayed-message stand-in: wedged for ~ts", [rabbit_misc:rs(XName)]),
    {reply, ok, arm(St#st{wedged = lists:usort([XName | Ws])})};
handle_call({unwedge, What}, _From, St = #st{wedged = Ws}) ->
    Left = case What of
               all -> [];
               _ when Ws =:= all -> all;
               XName -> lists:delete(XName, Ws)
           end,
    ?LOG_WARNING("x-delayed-message stand-in: unwedged (~p)", [What]),
    St1 = St#st{wedged = Left},
    {reply, ok, case St1#st.ready of
                    true -> arm(route_due(St1));
                    false -> St1
                end};
handle_call(overdue_at_start, _From, St) ->
    {reply, St#st.overdue_at_start, St};
handle_call(_Req, _From, St) ->
    {reply, {error, unknown_call}, St}.

handle_cast({hold_late, Late, Due, XName, Msg}, St) ->
    erlang:send_after(Late, self(), {late_hold, Due, XName, Msg}),
    {noreply, St};
handle_cast(_Msg, St) -> {noreply, St}.

handle_info(flush, St) -> {noreply, arm(flush(St))};
handle_info({late_hold, Due, XName, Msg}, St = #st{seq = Seq}) ->
    Pending = [{nobody, {Due, Seq + 1}, XName, Msg} | St#st.pending],
    {noreply, queue_flush(St#st{seq = Seq + 1, pending = Pending})};
handle_info(ready, St) ->
    case rabbit:is_running() of
        true -> {noreply, arm(route_due(St#st{ready = true}))};
        false -> erlang:send_after(500, self(), ready), {noreply, St}
    end;
handle_info(tick, St = #st{ready = true}) -> {noreply, arm(route_due(St))};
handle_info(tick, St) -> {noreply, St};
handle_info(tombstones, St) ->
    erlang:send_after(?TOMBSTONE_EVERY_MS, self(), tombstones),
    {noreply, maybe_compact(write_tombstones(St))};
handle_info(_Info, St) -> {noreply, St}.

terminate(_Reason, St = #st{fd = Fd}) ->
    _ = write_tombstones(St, ?STOP_GRACE_MS),
    _ = file:datasync(Fd),
    file:close(Fd).

code_change(_Old, St, _Extra) -> {ok, St}.

%% --- group commit ---------------------------------------------------------

%% The flush message is queued behind the calls already in the mailbox, so
%% one fsync covers every hold that arrived while the previous one ran.
queue_flush(St = #st{flush_queued = true}) -> St;
queue_flush(St) -> self() ! flush, St#st{flush_queued = true}.

flush(St = #st{pending = Pending, fd = Fd}) ->
    Batch = lists:reverse(Pending),
    Frames = [frame({hold, K, X, M}) || {_, K, X, M} <- Batch],
    Result = case append(Fd, Frames) of
                 ok -> file:datasync(Fd);
                 Err -> Err
             end,
    case Result of
        ok -> [ets:insert(?INDEX, {K, X, M}) || {_, K, X, M} <- Batch];
        _ -> ?LOG_ERROR("x-delayed-message stand-in: write failed: ~p", [Result])
    end,
    [gen_server:reply(From, Result) || {From, _, _, _} <- Batch, From =/= nobody],
    St#st{pending = [], flush_queued = false}.

%% --- scheduling -----------------------------------------------------------

arm(St = #st{timer = T}) ->
    _ = case T of undefined -> ok; _ -> erlang:cancel_timer(T) end,
    case first_routable(St) of
        '$end_of_table' -> St#st{timer = undefined};
        {_, _} when St#st.waiting_since =/= undefined ->
            St#st{timer = erlang:send_after(?RETRY_NOT_READY_MS, self(), tick)};
        {Due, _} ->
            Wait = min(max(Due - now_ms(), 0), ?MAX_TIMER_MS),
            St#st{timer = erlang:send_after(Wait, self(), tick)}
    end.

%% The first key whose exchange is not wedged (the index is in due order).
first_routable(#st{wedged = all}) -> '$end_of_table';
first_routable(#st{wedged = []}) -> ets:first(?INDEX);
first_routable(#st{wedged = Ws}) -> skip_wedged(ets:first(?INDEX), Ws).

skip_wedged('$end_of_table', _Ws) -> '$end_of_table';
skip_wedged(Key, Ws) ->
    case ets:lookup(?INDEX, Key) of
        [{_, XName, _}] ->
            case lists:member(XName, Ws) of
                true -> skip_wedged(ets:next(?INDEX, Key), Ws);
                false -> Key
            end;
        [] -> skip_wedged(ets:next(?INDEX, Key), Ws)
    end.

route_due(St) -> route_from(first_routable(St), now_ms(), St).

route_from({Due, _} = Key, Now, St) when Due =< Now ->
    [{Key, XName, Msg}] = ets:lookup(?INDEX, Key),
    Force = is_integer(St#st.waiting_since)
        andalso Now - St#st.waiting_since > ?WAIT_FOR_LEADER_MS,
    case route_one(XName, Msg, Force) of
        not_ready ->
            Since = case St#st.waiting_since of undefined -> Now; S -> S end,
            St#st{waiting_since = Since};
        routed ->
            ets:delete(?INDEX, Key),
            Tomb = queue:in({Now, Key, XName, Msg}, St#st.tombstones),
            St1 = St#st{tombstones = Tomb, waiting_since = undefined},
            route_from(next_routable(Key, St1), Now, St1)
    end;
route_from(_, _Now, St) -> St.

next_routable(_Key, #st{wedged = all}) -> '$end_of_table';
next_routable(Key, #st{wedged = []}) -> ets:next(?INDEX, Key);
next_routable(Key, #st{wedged = Ws}) -> skip_wedged(ets:next(?INDEX, Key), Ws).

route_one(XName, Msg, Force) ->
    case rabbit_exchange:lookup(XName) of
        {ok, X} ->
            put(?ROUTING_NOW, true),
            try
                deliver(X, Msg, Force)
            catch Class:Reason:Stack ->
                    ?LOG_ERROR("x-delayed-message stand-in: routing failed: ~p:~p ~p",
                               [Class, Reason, Stack]),
                    routed
            after
                erase(?ROUTING_NOW)
            end;
        {error, not_found} -> routed
    end.

%% RabbitMQ 3.10: a #basic_message{}, given a fresh id (queues may
%% deduplicate by it).
deliver(X, #basic_message{} = Msg0, Force) ->
    Msg = Msg0#basic_message{id = rabbit_guid:gen()},
    Delivery = rabbit_basic:delivery(false, false, Msg, undefined),
    Qs = rabbit_amqqueue:lookup_many(rabbit_exchange:route(X, Delivery)),
    when_ready(Qs, Force, fun() -> rabbit_amqqueue:deliver(Qs, Delivery) end);
%% RabbitMQ 4.x: an `mc` container, delivered the way the upstream 4.x
%% series does it (stateless: no confirm, no channel).
deliver(X, Mc, Force) ->
    Qs = targets(rabbit_exchange:route(X, Mc)),
    when_ready(Qs, Force, fun() -> rabbit_queue_type:deliver(Qs, Mc, #{}, stateless) end).

%% Delivers once every target queue can take a stateless delivery (or the
%% wait for one has run out).
when_ready(Qs, Force, Deliver) ->
    case Force orelse lists:all(fun ready/1, Qs) of
        true -> _ = Deliver(), routed;
        false -> not_ready
    end.

%% The queue records of routed names: 4.3 looks them up with
%% rabbit_db_queue:get_targets/1, 4.0 (where that is missing) with
%% rabbit_amqqueue:lookup_many/1 (gone in 4.3).
targets(QNames) ->
    _ = code:ensure_loaded(rabbit_db_queue),
    case erlang:function_exported(rabbit_db_queue, get_targets, 1) of
        true -> rabbit_db_queue:get_targets(QNames);
        false -> rabbit_amqqueue:lookup_many(QNames)
    end.

%% A quorum queue takes a stateless delivery only once it has a leader
%% (right after a node restart it may not have one yet). A positive answer
%% is remembered for READY_CACHE_MS, so a burst of due messages does not
%% ask Ra once per message.
ready(Q) ->
    Key = {ready, amqqueue:get_name(Q)},
    Now = now_ms(),
    case get(Key) of
        At when is_integer(At), Now - At < ?READY_CACHE_MS -> true;
        _ ->
            Ready = ready_now(Q),
            Ready andalso put(Key, Now),
            Ready
    end.

ready_now(Q) ->
    case amqqueue:get_type(Q) of
        rabbit_quorum_queue ->
            case amqqueue:get_pid(Q) of
                {Name, _LeaderNode} ->
                    try ra:members({Name, node()}, 500) of
                        {ok, _Members, _Leader} -> true;
                        _ -> false
                    catch _:_ -> false
                    end;
                _ -> false
            end;
        _ -> true
    end.

write_tombstones(St) -> write_tombstones(St, ?TOMBSTONE_GRACE_MS).

write_tombstones(St = #st{tombstones = Q}, Grace) ->
    Cutoff = now_ms() - Grace,
    {Keys, Rest} = take_older(Cutoff, Q, []),
    _ = case Keys of
            [] -> ok;
            _ -> append(St#st.fd, [frame({done, K}) || K <- Keys])
        end,
    St#st{tombstones = Rest, dead = St#st.dead + length(Keys)}.

take_older(Cutoff, Q, Acc) ->
    case queue:peek(Q) of
        {value, {At, Key, _, _}} when At =< Cutoff ->
            take_older(Cutoff, queue:drop(Q), [Key | Acc]);
        _ -> {Acc, Q}
    end.

%% --- the log --------------------------------------------------------------

%% A failed write (a full disk, say) may leave part of a frame behind; it is
%% cut off again, so later frames never sit behind a torn one (replay stops
%% at the first bad frame).
append(Fd, Frames) ->
    {ok, Before} = file:position(Fd, cur),
    case file:write(Fd, Frames) of
        ok -> ok;
        Err ->
            _ = file:position(Fd, Before),
            _ = file:truncate(Fd),
            Err
    end.

frame(Term) ->
    Bin = term_to_binary(Term),
    <<(byte_size(Bin)):32, (erlang:crc32(Bin)):32, Bin/binary>>.

%% Replays the log into the index; a torn tail (crash mid-write) ends it.
recover(Path) ->
    case file:read_file(Path) of
        {ok, Bin} -> replay(Bin, 0);
        {error, enoent} -> 0
    end.

replay(<<Size:32, Crc:32, Bin:Size/binary, Rest/binary>>, Seq) ->
    case erlang:crc32(Bin) of
        Crc ->
            case binary_to_term(Bin) of
                {hold, {_, S} = K, X, M} ->
                    ets:insert(?INDEX, {K, X, M}), replay(Rest, max(S, Seq));
                {done, K} ->
                    ets:delete(?INDEX, K), replay(Rest, Seq)
            end;
        _ -> Seq
    end;
replay(_Torn, Seq) -> Seq.

%% Writes the live entries (the index, plus routed messages still inside
%% their tombstone grace) to a fresh log that replaces the old one.
rewrite(Path, Routed) ->
    Tmp = Path ++ ".tmp",
    {ok, T} = file:open(Tmp, [write, raw, binary]),
    Live = ets:tab2list(?INDEX) ++ [{K, X, M} || {_, K, X, M} <- Routed],
    ok = file:write(T, [frame({hold, K, X, M}) || {K, X, M} <- Live]),
    ok = file:datasync(T),
    ok = file:close(T),
    ok = file:rename(Tmp, Path),
    file:open(Path, [append, raw, binary]).

maybe_compact(St = #st{dead = Dead}) ->
    case Dead >= ?COMPACT_MIN_DEAD andalso Dead > ets:info(?INDEX, size) of
        false -> St;
        true ->
            ok = file:close(St#st.fd),
            {ok, Fd} = rewrite(St#st.path, queue:to_list(St#st.tombstones)),
            St#st{fd = Fd, dead = 0}
    end.

now_ms() -> os:system_time(millisecond).
