# flashkv_embed_kernels(OUTPUT file.cpp ROOT dir FILES a.cuh b.cuh ...)
# Generates a C++ file holding every kernel header as a string, keyed by its path under ROOT, so
# the library carries its device sources and NVRTC compiles them without touching the disk.
function(flashkv_embed_kernels)
  cmake_parse_arguments(ARG "" "OUTPUT;ROOT" "FILES" ${ARGN})
  add_custom_command(
    OUTPUT "${ARG_OUTPUT}"
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${ARG_OUTPUT} -DROOT=${ARG_ROOT} "-DFILES=${ARG_FILES}"
            -P "${CMAKE_SOURCE_DIR}/cmake/EmbedKernelsScript.cmake"
    DEPENDS ${ARG_FILES} "${CMAKE_SOURCE_DIR}/cmake/EmbedKernelsScript.cmake"
    COMMENT "Embedding kernel sources"
    VERBATIM)
endfunction()
